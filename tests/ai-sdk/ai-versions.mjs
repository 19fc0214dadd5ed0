// Module hooks for provider.test.mjs (registered there with `module.register`). The provider
// (www/ai-sdk.js) reads the installed `ai`'s version from `ai/package.json`, resolved from its own
// folder, as in an app. The test loads it once for each `ai` major, each copy under a query
// (`ai-sdk.js?ai=5`), and this hook resolves that copy's `ai` and `ai/...` to this folder's `ai5`,
// `ai6` or `ai` (7), the packages the test calls it with. Any other `?ai=<version>` gets a
// package.json of that version alone: an `ai` the provider does not support.

const PACKAGES = { 5: 'ai5', 6: 'ai6', 7: 'ai' };

export async function resolve(specifier, context, nextResolve) {
  const path = /^ai(\/.*)?$/.exec(specifier);
  const wanted = path && context.parentURL?.startsWith('file:') ? new URL(context.parentURL).searchParams.get('ai') : null;
  if (!wanted) return nextResolve(specifier, context);
  const name = PACKAGES[wanted];
  if (name) return nextResolve(`${name}${path[1] ?? ''}`, { ...context, parentURL: import.meta.url });
  if (path[1] !== '/package.json') throw new Error(`ai ${wanted} is not installed here: only its package.json is (${specifier})`);
  const manifest = JSON.stringify({ name: 'ai', version: wanted });
  return { url: `data:application/json,${encodeURIComponent(manifest)}`, shortCircuit: true };
}
