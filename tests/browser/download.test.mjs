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
