// Split models (llama.cpp's gguf-split shards, written here by `kestrel split`) in the page: the
// first shard's URL brings the others, each kept in the Cache API and counted as one model by the
// cache helpers; the shards as Files (an array, in any order) load the same model; `estimate()`
// reads every shard's header. Each generates the whole file's greedy tokens and log-probabilities,
// to the bit.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { before, test } from 'node:test';
import { MINUTES, ROOT, cliPath, openTestPage, serveAndLaunch } from './harness.mjs';

// The random-weight qwen3 model (67 MB), cut into shards of at most 10 MB of tensors (its 50 MB
// embedding table takes one of its own).
const WHOLE_URL = '/models/synthetic-qwen3-f32.gguf';
const SHARD_URLS = [];

const env = serveAndLaunch();
before(() => {
  const dir = join(ROOT, 'models/split-test');
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  execFileSync(cliPath(), ['split', join(ROOT, WHOLE_URL), join(dir, 'qwen3'), '--max-size', '10M'], { stdio: 'inherit' });
  SHARD_URLS.push(...readdirSync(dir).sort().map((name) => `/models/split-test/${name}`));
  assert.ok(SHARD_URLS.length >= 3, SHARD_URLS.join());
  assert.match(SHARD_URLS[0], new RegExp(`-00001-of-0000${SHARD_URLS.length}\\.gguf$`));
});

test('a split model loads from its first shard URL, from the cache and from Files, as the whole file', { timeout: 15 * MINUTES }, async () => {
  const page = await openTestPage(env.browser.context, env.server.url);
  page.setDefaultTimeout(12 * MINUTES);
  const r = await page.evaluate(async ({ whole, shards, digests }) => {
    const { createEngine, estimate, hasModelInCache, listCachedModels, deleteModelFromCache } = window.kestrel;
    const run = async (model, sha256) => {
      const progress = [];
      const engine = await createEngine({ model, sha256, backend: 'cpu', context_length: 128, onProgress: (p) => progress.push(p) });
      const out = await engine.completions.create({
        prompt: 'The kestrel hovers', max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 5,
      });
      // The tokens, and every step's five most likely tokens with their log-probabilities.
      const result = { ids: out.kestrel.logprobs.map((l) => [l.token_id, l.top]), cache: engine.info.model_cache, progress };
      await engine.unload();
      return result;
    };
    const first = new URL(shards[0], location.href).href;
    const alone = await run(whole);
    const fromUrl = await run(shards[0], digests);
    const cached = await hasModelInCache(shards[0]);
    const listed = (await listCachedModels()).find((m) => m.url === first);
    const fromCache = await run(shards[0]);
    const files = await Promise.all(shards.map(async (url) => new File([await (await fetch(url)).blob()], url.split('/').pop())));
    const fromFiles = await run([...files].reverse());
    const pick = (e) => ({ weight_bytes: e.weight_bytes, kv_cache_bytes: e.kv_cache_bytes, cpu_weight_bytes: e.cpu.weight_bytes, cpu_fits: e.cpu.fits });
    const estimates = { whole: pick(await estimate({ model: whole })), split: pick(await estimate({ model: shards[0] })) };
    const notFirst = await createEngine({ model: shards[1], backend: 'cpu' }).then(() => null, (e) => ({ code: e.code, message: e.message }));
    const missing = await createEngine({ model: files.slice(0, -1), backend: 'cpu' }).then(() => null, (e) => ({ code: e.code, message: e.message }));
    const deleted = await deleteModelFromCache(shards[0]);
    const afterDelete = (await listCachedModels()).filter((m) => m.url.includes('/split-test/'));
    const error = (e) => ({ code: e.code, message: e.message });
    const wrong = digests.map((d, k) => (k === 1 ? d.replace(/^./, (c) => (c === '0' ? '1' : '0')) : d));
    const wrongDigest = await createEngine({ model: shards[0], backend: 'cpu', sha256: wrong }).then(() => null, error);
    const oneDigest = await createEngine({ model: shards[0], backend: 'cpu', sha256: digests[0] }).then(() => null, error);
    const afterWrong = (await listCachedModels()).filter((m) => m.url.includes('/split-test/'));
    return { alone, fromUrl, cached, listed, fromCache, fromFiles, estimates, notFirst, missing, deleted, afterDelete, wrongDigest, oneDigest, afterWrong };
  }, { whole: WHOLE_URL, shards: SHARD_URLS, digests: SHARD_URLS.map((url) => createHash('sha256').update(readFileSync(join(ROOT, url))).digest('hex')) });
  const shardBytes = SHARD_URLS.reduce((sum, url) => sum + statSync(join(ROOT, url)).size, 0);
  const phases = (run) => [...new Set(run.progress.map((p) => p.phase))];
  console.log('split:', JSON.stringify({ ...r, alone: r.alone.ids.map(([id]) => id), fromUrl: undefined, fromCache: phases(r.fromCache), fromFiles: undefined }));
  assert.equal(r.alone.ids.length, 6);
  for (const [how, run] of [['the first shard URL', r.fromUrl], ['the Cache API', r.fromCache], ['Files', r.fromFiles]]) {
    assert.deepEqual(run.ids, r.alone.ids, `loaded from ${how}`);
  }
  // Downloaded: every shard read in turn, the total all of them from the start.
  const download = r.fromUrl.progress.filter((p) => p.phase === 'download');
  const n = SHARD_URLS.length;
  assert.deepEqual([...new Set(download.map((p) => p.shard))], Array.from({ length: n }, (_, k) => k + 1));
  assert.ok(download.every((p) => p.shards === n));
  const ready = r.fromUrl.progress.at(-1);
  assert.equal(ready.phase, 'ready');
  assert.equal(ready.loaded, shardBytes);
  assert.ok(download[0].total > 0.99 * shardBytes && download[0].total <= shardBytes, `total ${download[0].total} of ${shardBytes}`);
  assert.deepEqual(r.fromUrl.cache, { stored: true, error: null });
  assert.equal(r.cached, true);
  assert.deepEqual(r.listed, { url: new URL(SHARD_URLS[0], env.server.url).href, bytes: shardBytes });
  assert.deepEqual(phases(r.fromCache), ['cache', 'compile', 'ready']);
  assert.deepEqual(r.estimates.split, r.estimates.whole);
  assert.equal(r.notFirst?.code, 'bad_model');
  assert.match(r.notFirst.message, new RegExp(`shard 2 of ${n}`));
  assert.equal(r.missing?.code, 'bad_model');
  assert.match(r.missing.message, new RegExp(`only ${n - 1} of the model's ${n} shards`));
  assert.equal(r.deleted, true);
  assert.deepEqual(r.afterDelete, []);
  // `sha256`: one digest per shard, each checked as its shard streams; a mismatch keeps no shard.
  assert.equal(r.wrongDigest?.code, 'bad_model');
  assert.match(r.wrongDigest.message, new RegExp(`\\(shard 2 of ${n}\\): its sha256 is`));
  assert.equal(r.oneDigest?.code, 'invalid_option');
  assert.deepEqual(r.afterWrong, []);
  await page.close();
});
