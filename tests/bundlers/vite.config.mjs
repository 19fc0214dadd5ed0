// The app's Vite config (every Vite version in package.json reads it). `base: './'`: the test's
// static server serves each production build from its own folder. The dev server passes /models/
// to the test's static server (KESTREL_MODELS_ORIGIN), so the page fetches the model from its own
// origin, as an app that serves its model would.
const models = process.env.KESTREL_MODELS_ORIGIN;

export default {
  base: './',
  server: models ? { proxy: { '/models': models } } : {},
};
