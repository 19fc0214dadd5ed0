// The app's webpack 5 production build into dist/webpack/. webpack bundles scripts only: the
// small plugin puts the app's index.html beside them (apps usually use html-webpack-plugin).
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export default {
  mode: 'production',
  entry: './main.js',
  output: { path: fileURLToPath(new URL('dist/webpack', import.meta.url)), clean: true },
  plugins: [
    {
      apply(compiler) {
        compiler.hooks.thisCompilation.tap('index.html', (compilation) => {
          const html = readFileSync(new URL('index.html', import.meta.url));
          compilation.emitAsset('index.html', new compiler.webpack.sources.RawSource(html));
        });
      },
    },
  ],
};
