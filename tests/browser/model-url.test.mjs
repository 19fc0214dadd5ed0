// A model URL on another origin, as a Hugging Face download link is: the hub redirects it to its
// CDN (a third origin), which allows CORS and serves byte ranges. model-hub.mjs stands in for both
// on loopback ports (nothing here reaches a real hub). `estimate()` reads the header through the
// redirect with range requests, `createEngine` streams the file through it (its sha256 checked),
// generates, and leaves it in the Cache API under the hub URL, from which a second engine loads
// without a request. A CDN that sends no CORS headers is refused as the browser refuses it.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { CONTEXT_LENGTH, MINUTES, ROOT, openTestPage, serveAndLaunch } from './harness.mjs';
import { startModelHub } from './model-hub.mjs';

// The random-weight qwen3 model (67 MB): the smallest the browser suite has.
const LOCAL_URL = '/models/synthetic-qwen3-f32.gguf';
const FILE = join(ROOT, LOCAL_URL);
const BYTES = readFileSync(FILE);
const SHA256 = createHash('sha256').update(BYTES).digest('hex');
const MAX_TOKENS = 3;

const env = serveAndLaunch();
let hub;
let closedHub;
before(async () => {
  hub = await startModelHub({ file: FILE });
  closedHub = await startModelHub({ file: FILE, cors: false });
});
after(async () => {
  await hub?.close();
  await closedHub?.close();
});

const fileRequests = (server) => hub.log.filter((r) => r.server === server && r.method === 'GET');

test('a model URL on another origin, redirected to a CDN, loads as a hub download link does', { timeout: 20 * MINUTES }, async () => {
  const page = await openTestPage(env.browser.context, env.server.url);
  page.setDefaultTimeout(15 * MINUTES);
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));

  // The header alone, through the redirect, with range requests: the same answer as the file
  // from the page's own origin.
  const [viaHub, local] = await page.evaluate(({ urls, contextLength }) => Promise.all(urls.map((model) =>
    window.kestrel.estimate({ model, context_length: contextLength }))), { urls: [hub.url, LOCAL_URL], contextLength: CONTEXT_LENGTH });
  assert.deepEqual(viaHub, local);
  assert.equal(viaHub.file_bytes, BYTES.length);
  assert.equal(viaHub.arch, 'qwen3');
  const rangeReads = fileRequests('cdn');
  assert.ok(rangeReads.length >= 1, `the CDN served the header: ${JSON.stringify(hub.log)}`);
  assert.ok(rangeReads.every((r) => r.range && r.origin), `only CORS range requests reached the CDN: ${JSON.stringify(rangeReads)}`);
  assert.equal(fileRequests('hub').length, rangeReads.length, 'each read went through the hub\'s redirect');

  // The download: streamed through the redirect (the digest checks every byte), generated from,
  // and kept in the Cache API under the hub URL.
  const load = ({ model, sha256, contextLength, maxTokens }) => (async () => {
    const phases = new Set();
    const engine = await window.kestrel.createEngine({
      model, sha256, backend: 'cpu', context_length: contextLength, onProgress: (p) => phases.add(p.phase),
    });
    const out = await engine.completions.create({ prompt: 'Once upon a time', max_tokens: maxTokens, temperature: 0, ignore_eos: true });
    await engine.unload();
    return { phases: [...phases], ids: out.kestrel.token_ids, cached: await window.kestrel.hasModelInCache(model), listed: await window.kestrel.listCachedModels() };
  })();
  const args = { model: hub.url, sha256: SHA256, contextLength: CONTEXT_LENGTH, maxTokens: MAX_TOKENS };
  const first = await page.evaluate(load, args);
  console.log(`first load: phases ${first.phases.join(', ')}; tokens ${first.ids.join(' ')}; hub log ${hub.log.map((r) => `${r.server} ${r.method}${r.range ? ` ${r.range}` : ''}`).join('; ')}`);
  assert.ok(first.phases.includes('download') && !first.phases.includes('cache'), `phases: ${first.phases}`);
  assert.equal(first.ids.length, MAX_TOKENS);
  const whole = fileRequests('cdn').filter((r) => !r.range);
  assert.equal(whole.length, 1, `one download of the whole file from the CDN: ${JSON.stringify(fileRequests('cdn'))}`);
  assert.ok(whole[0].origin, 'the download was a CORS request');
  assert.equal(first.cached, true, 'hasModelInCache(hub URL)');
  assert.deepEqual(first.listed.filter((m) => m.url === hub.url), [{ url: hub.url, bytes: BYTES.length }]);

  // A second engine: from the Cache API, without a request to either server, the same tokens.
  const logged = hub.log.length;
  const second = await page.evaluate(load, args);
  assert.ok(second.phases.includes('cache') && !second.phases.includes('download'), `phases: ${second.phases}`);
  assert.deepEqual(hub.log.slice(logged), [], 'requests after the model was cached');
  assert.deepEqual(second.ids, first.ids);

  // The page and its worker asked the page's origin, the hub and the CDN (all loopback), no other.
  const allowed = [env.server.url, ...hub.origins];
  assert.ok(requests.some((u) => new URL(u).origin === hub.origins[1]), 'the browser followed the redirect to the CDN');
  assert.deepEqual(requests.filter((u) => !allowed.includes(new URL(u).origin)), [], 'requests to another origin');
  assert.equal(await page.evaluate((url) => window.kestrel.deleteModelFromCache(url), hub.url), true);
});

test('a CDN that sends no CORS headers is refused with fetch_failed', { timeout: 5 * MINUTES }, async () => {
  const page = await openTestPage(env.browser.context, env.server.url);
  const error = await page.evaluate((model) => window.kestrel.estimate({ model }).then(
    () => null,
    (e) => ({ code: e.code, message: e.message }),
  ), closedHub.url);
  assert.equal(error?.code, 'fetch_failed', JSON.stringify(error));
  assert.ok(error.message.includes(closedHub.url), error.message);
});
