// Model cache management: a `sha256` checked while the file streams (a mismatch is `bad_model`
// and the bad copy is not kept), the cached models listed with their sizes, and deleted.
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
    const engine = await createEngine({ model, sha256: sha256.toUpperCase(), context_length: contextLength });
    await engine.unload();
    const listed = await listCachedModels();
    const url = new URL(model, location.href).href;
    const cached = await hasModelInCache(model);
    const deleted = await deleteModelFromCache(model);
    return { failed, afterFailure, badOption, listed, url, cached, deleted, afterDelete: await listCachedModels() };
  }, { model: MODEL_URL, sha256: SHA256, contextLength: CONTEXT_LENGTH });
  console.log('cache:', JSON.stringify(r));
  assert.equal(r.failed?.code, 'bad_model');
  assert.match(r.failed.message, new RegExp(`sha256 is ${SHA256}`));
  assert.deepEqual(r.afterFailure, [], 'the copy that failed the check was not kept');
  assert.equal(r.badOption, 'invalid_option');
  assert.deepEqual(r.listed, [{ url: r.url, bytes: file.length }]);
  assert.equal(r.cached, true);
  assert.equal(r.deleted, true);
  assert.deepEqual(r.afterDelete, []);
  await page.close();
});
