// The app's Vite config plus what the dev servers of Vite 5-7 need for the package: without it they
// pre-bundle it into node_modules/.vite/deps/, where `new URL('./worker.js', import.meta.url)`
// finds no worker.
import config from './vite.config.mjs';

export default { ...config, optimizeDeps: { exclude: ['@kestrel-llm/web'] } };
