// Loading from a host that sends no Content-Length (one that compresses on the fly): the
// progress total comes from the GGUF header once it has arrived. The page's requests (the
// worker's included) all stay on its origin.
import assert from 'node:assert/strict';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startServer } from '../../www/serve.mjs';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, ROOT, launch, openTestPage } from './harness.mjs';

test('without a Content-Length, progress reports the size the header declares', { timeout: 20 * MINUTES }, async () => {
  const server = await startServer({ omitLength: true });
  const browser = await launch();
  const requests = [];
  try {
    const page = await openTestPage(browser.context, server.url);
    page.on('request', (r) => requests.push(r.url()));
    page.setDefaultTimeout(15 * MINUTES);
    const r = await page.evaluate(async ({ model, contextLength }) => {
      const reports = [];
      const engine = await window.kestrel.createEngine({
        model,
        context_length: contextLength,
        onProgress: (p) => {
          if (p.phase === 'download') reports.push([p.loaded, p.total]);
        },
      });
      const done = await engine.completions.create({ prompt: 'Hi', max_tokens: 1, temperature: 0 });
      await engine.unload();
      return { reports, tokens: done.usage.completion_tokens };
    }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
    const size = statSync(join(ROOT, MODEL_URL)).size;
    const known = r.reports.findIndex(([, total]) => total !== 0);
    console.log(`download progress: ${r.reports.length} reports, total first known at ${r.reports[known]?.[0]} of ${size} bytes`);
    assert.ok(known >= 0, 'a total was reported');
    // Before the header has arrived there is no total; from then on it is the file's size.
    assert.ok(r.reports.slice(0, known).every(([loaded]) => loaded < 4 << 20), 'the header is in the first MiBs');
    assert.ok(r.reports.slice(known).every(([, total]) => total === size), 'every later report has the header-declared size');
    assert.ok(r.reports[known][0] < size / 2, 'the total was known early in the download');
    assert.equal(r.tokens, 1);
    assert.ok(requests.some((u) => u.includes('.gguf')), `the worker's fetch is recorded: ${requests}`);
    assert.deepEqual(requests.filter((u) => new URL(u).origin !== server.url), [], 'requests to other origins');
  } finally {
    await browser.close();
    await server.close();
  }
});

// A download that ends early with no error (a host or proxy cutting the stream short, as a new
// user's app saw behind `vite preview`) is no corrupt file: it is fetched again once, by itself,
// and where it is cut again the load fails with `fetch_failed` naming the bytes received and
// expected, and keeps no copy.
test('a download cut short is fetched again, and fails as fetch_failed when cut again', { timeout: 20 * MINUTES }, async () => {
  const size = statSync(join(ROOT, MODEL_URL)).size;
  const once = await startServer({ cutShort: { bytes: Math.floor(size / 2), times: 1 } });
  const always = await startServer({ cutShort: { bytes: Math.floor(size / 2), times: 1000 } });
  const browser = await launch();
  try {
    const run = async (server) => {
      const page = await openTestPage(browser.context, server.url);
      page.setDefaultTimeout(15 * MINUTES);
      return page.evaluate(async ({ model, contextLength }) => {
        const { createEngine, hasModelInCache } = window.kestrel;
        try {
          const engine = await createEngine({ model, context_length: contextLength });
          const done = await engine.completions.create({ prompt: 'Hi', max_tokens: 1, temperature: 0 });
          await engine.unload();
          return { tokens: done.usage.completion_tokens, cached: await hasModelInCache(model) };
        } catch (e) {
          return { error: { code: e.code, message: e.message }, cached: await hasModelInCache(model) };
        }
      }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
    };
    const gets = (server) => server.log.filter((r) => r.path.endsWith('.gguf') && !r.range && r.method === 'GET').length;
    const retried = await run(once);
    assert.equal(retried.tokens, 1, JSON.stringify(retried));
    assert.equal(gets(once), 2, 'the cut download was fetched again once');
    assert.equal(retried.cached, true, 'the whole second download is cached');
    const failed = await run(always);
    assert.equal(failed.error?.code, 'fetch_failed', JSON.stringify(failed));
    assert.match(failed.error.message, new RegExp(`ended after ${Math.floor(size / 2)} of ${size} bytes`));
    assert.equal(gets(always), 2, 'fetched twice, then given up');
    assert.equal(failed.cached, false, 'no copy of a cut download is kept');
  } finally {
    await browser.close();
    await once.close();
    await always.close();
  }
});
