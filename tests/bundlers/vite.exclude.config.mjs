// The app's Vite config plus what the dev servers of Vite 5-7 need for the package: without the
// exclude they pre-bundle it into node_modules/.vite/deps/, where
// `new URL('./worker.js', import.meta.url)` finds no worker. Excluded, the package's own imports
// are served as they are, so the @langchain/core modules that its LangChain adapter imports
// (www/langchain.js) are pre-bundled by name: served raw, they would import CommonJS packages
// the browser cannot load. (An app without the LangChain adapter needs only the exclude.)
import config from './vite.config.mjs';

export default {
  ...config,
  optimizeDeps: {
    exclude: ['@kestrel-llm/web'],
    include: ['errors', 'language_models/chat_models', 'language_models/structured_output', 'messages', 'outputs',
      'utils/function_calling', 'utils/json_schema', 'utils/standard_schema', 'utils/types'].map((m) => `@langchain/core/${m}`),
  },
};
