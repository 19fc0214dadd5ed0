// Bad input and missing WebGPU give their error codes and leave the page working; the demo page
// streams a reply with its speed figures (screenshot in tests/artifacts/).
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { ARTIFACTS, CONTEXT_LENGTH, launch, MINUTES, MODEL_URL, openTestPage, serveAndLaunch } from './harness.mjs';

describe('errors and the demo page', { timeout: 60 * MINUTES }, () => {
  const env = serveAndLaunch();

  test('(e) a corrupt or truncated model gives bad_model and the page keeps working', { timeout: 30 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(20 * MINUTES);
    const r = await page.evaluate(async ({ modelUrl, contextLength }) => {
      const attempt = async (model) => {
        try {
          await window.kestrel.createEngine({ model });
          return { ok: true };
        } catch (e) {
          return { code: e.code, message: e.message, isError: e instanceof Error };
        }
      };
      const garbage = await attempt(new Blob([new Uint8Array(4096).fill(7)]));
      // The real file's first 3 MB: the header parses, the tensors never complete.
      const head = await (await fetch(modelUrl)).arrayBuffer();
      const truncated = await attempt(new Blob([head.slice(0, 3 << 20)]));
      // Bit-flipped header: a tensor count far past the file.
      const flipped = new Uint8Array(head.slice(0, 1 << 20));
      flipped.set([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], 8);
      const corrupt = await attempt(new Blob([flipped]));
      const missing = await attempt('/models/does-not-exist.gguf');
      // The page still works: a good model loads and generates.
      const engine = await window.kestrel.createEngine({ model: new Blob([head]), context_length: contextLength });
      const out = await engine.completions.create({ prompt: 'Hello', temperature: 0, max_tokens: 2 });
      let invalid;
      try {
        await engine.completions.create({ prompt: 'Hello', temperature: -1 });
      } catch (e) {
        invalid = { code: e.code, message: e.message };
      }
      let overflow;
      try {
        await engine.completions.create({ prompt: 'a '.repeat(9000), max_tokens: 1 });
      } catch (e) {
        overflow = { code: e.code, message: e.message };
      }
      const after = await engine.completions.create({ prompt: 'Hello', temperature: 0, max_tokens: 1 });
      await engine.unload();
      return { garbage, truncated, corrupt, missing, tokens: out.usage.completion_tokens, invalid, overflow, after: after.usage.completion_tokens };
    }, { modelUrl: MODEL_URL, contextLength: CONTEXT_LENGTH });
    console.log(JSON.stringify(r, null, 1));
    for (const k of ['garbage', 'truncated', 'corrupt']) {
      assert.equal(r[k].code, 'bad_model', `${k}: ${JSON.stringify(r[k])}`);
      assert.ok(r[k].isError && r[k].message.length > 10);
    }
    assert.equal(r.missing.code, 'fetch_failed');
    assert.equal(r.tokens, 2);
    assert.equal(r.invalid.code, 'invalid_option');
    assert.match(r.invalid.message, /temperature/);
    assert.equal(r.overflow.code, 'context_overflow');
    assert.equal(r.after, 1);
    await page.close();
  });

  test('(e) without WebGPU: no_webgpu, and the page keeps working', { timeout: 10 * MINUTES }, async () => {
    // navigator.gpu missing in the page.
    const page = await openTestPage(env.browser.context, env.server.url);
    const r = await page.evaluate(async (modelUrl) => {
      Object.defineProperty(Navigator.prototype, 'gpu', { value: undefined, configurable: true });
      try {
        await window.kestrel.createEngine({ model: modelUrl });
        return { ok: true };
      } catch (e) {
        return { code: e.code, message: e.message, alive: 1 + 1 };
      }
    }, MODEL_URL);
    assert.equal(r.code, 'no_webgpu');
    assert.equal(r.alive, 2);
    await page.close();

    // A browser without the WebGPU flags: navigator.gpu exists but finds no adapter (the worker's
    // wasm engine reports it).
    const plain = await launch({ webgpu: false });
    try {
      const p = await openTestPage(plain.context, env.server.url);
      const r2 = await p.evaluate(async () => {
        try {
          await window.kestrel.createEngine({ model: new Blob([new Uint8Array(16)]) });
          return { ok: true };
        } catch (e) {
          return { code: e.code, message: e.message };
        }
      });
      console.log('without WebGPU flags:', JSON.stringify(r2));
      assert.equal(r2.code, 'no_webgpu');
      assert.equal(await p.evaluate(() => document.title), 'kestrel test page');
    } finally {
      await plain.close();
    }
  });

  test('(f) the demo streams a reply with TTFT and tok/s (screenshot in tests/artifacts/)', { timeout: 30 * MINUTES }, async () => {
    const page = await env.browser.context.newPage();
    page.setDefaultTimeout(20 * MINUTES);
    // Every request the demo makes (its worker's included) stays on the page's origin.
    const requests = [];
    page.on('request', (r) => requests.push(r.url()));
    await page.goto(`${env.server.url}/www/demo/?max_tokens=16&context_length=${CONTEXT_LENGTH}`);
    await page.waitForSelector('body[data-ready="true"]');
    assert.match(await page.textContent('#adapter'), /\S/);
    await page.fill('#input', 'Tell me about kestrels.');
    await page.click('#send');
    // Mid-generation: a few tokens streamed, a live tok/s figure shown.
    await page.waitForFunction(() => Number(document.getElementById('ntok').textContent) >= 3);
    mkdirSync(ARTIFACTS, { recursive: true });
    const shot = join(ARTIFACTS, 'demo-mid-generation.png');
    await page.screenshot({ path: shot, fullPage: true });
    const text = await page.textContent('.msg.assistant');
    const toks = await page.textContent('#toks');
    const ttft = await page.textContent('#ttft');
    console.log(`demo: ${JSON.stringify(text)}; ${toks} tok/s; TTFT ${ttft}; screenshot ${shot}`);
    assert.ok(text.trim().length > 0, 'no tokens shown');
    assert.match(toks, /^\d+(\.\d+)?$/);
    assert.match(ttft, /^\d+(\.\d+)? s$/);
    await page.click('#stop');
    await page.waitForFunction(() => !document.querySelector('.streaming'));
    await page.close();
    assert.ok(requests.some((u) => u.endsWith('.gguf')), `the worker's model fetch is among the recorded requests: ${requests}`);
    const elsewhere = requests.filter((u) => new URL(u).origin !== env.server.url);
    assert.deepEqual(elsewhere, [], 'requests to other origins');
  });
});
