// Model cache management: a `sha256` checked while the file streams (a mismatch is `bad_model`
// and the bad copy is not kept), the cached models listed with their sizes, and deleted; a storage
// quota without room for the model (it runs, is not stored, and `quota_exceeded` says why).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, ROOT, openTestPage, serveAndLaunch } from './harness.mjs';

const env = serveAndLaunch();
const file = readFileSync(join(ROOT, MODEL_URL));
const SHA256 = createHash('sha256').update(file).digest('hex');

test('sha256 is checked as the model streams; cached models are listed and deleted', { timeout: 10 * MINUTES }, async () => {
  const page = await openTestPage(env.browser.context, env.server.url);
  page.setDefaultTimeout(8 * MINUTES);
  const r = await page.evaluate(async ({ model, sha256, contextLength }) => {
    const { createEngine, listCachedModels, deleteModelFromCache, hasModelInCache } = window.kestrel;
    const wrong = sha256.replace(/^./, (c) => (c === '0' ? '1' : '0'));
    const failed = await createEngine({ model, sha256: wrong, context_length: contextLength }).then(() => null, (e) => ({ code: e.code, message: e.message }));
    const afterFailure = await listCachedModels();
    const badOption = await createEngine({ model, sha256: 'xyz' }).then(() => null, (e) => e.code);
    const badBudget = await createEngine({ model, submit_budget_ms: 1001 }).then(() => null, (e) => e.code);
    // No submission budget: each prompt chunk is one GPU submission.
    const engine = await createEngine({ model, sha256: sha256.toUpperCase(), context_length: contextLength, submit_budget_ms: 0 });
    const budget = engine.info.model.submit_budget_ms;
    await engine.unload();
    const listed = await listCachedModels();
    const url = new URL(model, location.href).href;
    const cached = await hasModelInCache(model);
    const deleted = await deleteModelFromCache(model);
    return { failed, afterFailure, badOption, badBudget, budget, listed, url, cached, deleted, afterDelete: await listCachedModels() };
  }, { model: MODEL_URL, sha256: SHA256, contextLength: CONTEXT_LENGTH });
  console.log('cache:', JSON.stringify(r));
  assert.equal(r.failed?.code, 'bad_model');
  assert.match(r.failed.message, new RegExp(`sha256 is ${SHA256}`));
  assert.deepEqual(r.afterFailure, [], 'the copy that failed the check was not kept');
  assert.equal(r.badOption, 'invalid_option');
  assert.equal(r.badBudget, 'invalid_option');
  assert.equal(r.budget, null);
  assert.deepEqual(r.listed, [{ url: r.url, bytes: file.length }]);
  assert.equal(r.cached, true);
  assert.equal(r.deleted, true);
  assert.deepEqual(r.afterDelete, []);
  await page.close();
});

test('a storage quota without room: the model runs from the network, quota_exceeded says why it is not cached', { timeout: 10 * MINUTES }, async () => {
  const page = await openTestPage(env.browser.context, env.server.url);
  page.setDefaultTimeout(8 * MINUTES);
  // Chromium's own quota for this origin (DevTools protocol), below even a small KV snapshot's size.
  const cdp = await env.browser.context.newCDPSession(page);
  const origin = new URL(env.server.url).origin;
  await cdp.send('Storage.overrideQuotaForOrigin', { origin, quotaSize: 1000 });
  try {
    const r = await page.evaluate(async ({ model, contextLength }) => {
      const { createEngine, listCachedModels } = window.kestrel;
      const engine = await createEngine({ model, context_length: contextLength, persistPrefix: true });
      const out = await engine.completions.create({ prompt: 'the kestrel', max_tokens: 2, temperature: 0 });
      await engine.memory(); // answered once the KV prefix's save has been tried
      await engine.unload();
      const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle('kestrel-kv-prefixes', { create: true });
      const snapshots = [];
      for await (const [name] of dir.entries()) snapshots.push(name);
      return { modelCache: engine.info.model_cache, generated: out.kestrel.token_ids.length, cached: await listCachedModels(), snapshots };
    }, { model: '/models/synthetic-qwen3-f32.gguf', contextLength: CONTEXT_LENGTH });
    console.log('quota:', JSON.stringify(r));
    assert.equal(r.modelCache.stored, false);
    assert.equal(r.modelCache.error?.code, 'quota_exceeded');
    assert.match(r.modelCache.error.message, /67\.8 MB\) does not fit this site's storage quota/);
    assert.equal(r.generated, 2, 'the model ran from the network');
    assert.deepEqual(r.cached, [], 'nothing was stored');
    assert.deepEqual(r.snapshots, [], 'no KV prefix was saved past the quota');
  } finally {
    await cdp.send('Storage.overrideQuotaForOrigin', { origin });
  }
  await page.close();
});
