// Bad input and missing WebGPU give their error codes and leave the page working; the demo page
// shows the adapter and the will-it-fit estimate, streams a reply with its speed figures
// (screenshot in tests/artifacts/), resets the conversation and chats with a dropped GGUF file.
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
          const { KestrelError, isKestrelError } = window.kestrel;
          return { code: e.code, message: e.message, isError: e instanceof KestrelError && isKestrelError(e) && e instanceof Error };
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
      // A URL that answers with a web page (as a dev server's index.html fallback does), as a URL
      // and as the bytes of a saved page.
      const pageUrl = new URL('/tests/browser/page.html', location.href).href;
      const html = await attempt(pageUrl);
      const htmlEstimate = await window.kestrel.estimate({ model: pageUrl }).then(() => ({ ok: true }), (e) => ({ code: e.code, message: e.message }));
      const savedPage = await attempt(new Blob(['<!doctype html><title>Model page</title>']));
      // The page still works: a good model loads and generates.
      const engine = await window.kestrel.createEngine({ model: new Blob([head]), context_length: contextLength });
      const out = await engine.completions.create({ prompt: 'Hello', temperature: 0, max_tokens: 2 });
      let invalid;
      try {
        await engine.completions.create({ prompt: 'Hello', temperature: -1 });
      } catch (e) {
        invalid = { code: e.code, message: e.message };
      }
      // OpenAI's ranges, and numbers JSON cannot carry (which JSON.stringify would turn into null,
      // "the default"), each refused naming its option.
      const refusals = [];
      for (const options of [{ temperature: 2.5 }, { temperature: NaN }, { top_p: Infinity }, { max_tokens: -5 }, { seed: 1.5 }]) {
        refusals.push(await engine.completions.create({ prompt: 'Hello', ...options }).then(() => null, (e) => ({ code: e.code, message: e.message })));
      }
      // -Infinity in logit_bias bans a token, as it always did.
      const banned = await engine.completions.create({ prompt: 'Hello', temperature: 0, max_tokens: 1, logit_bias: { 0: -Infinity } });
      let overflow;
      try {
        await engine.completions.create({ prompt: 'a '.repeat(9000), max_tokens: 1 });
      } catch (e) {
        overflow = { code: e.code, message: e.message };
      }
      const after = await engine.completions.create({ prompt: 'Hello', temperature: 0, max_tokens: 1 });
      await engine.unload();
      return { garbage, truncated, corrupt, missing, html, htmlEstimate, savedPage, tokens: out.usage.completion_tokens, invalid, refusals, banned: banned.usage.completion_tokens, overflow, after: after.usage.completion_tokens };
    }, { modelUrl: MODEL_URL, contextLength: CONTEXT_LENGTH });
    console.log(JSON.stringify(r, null, 1));
    for (const k of ['garbage', 'truncated', 'corrupt']) {
      assert.equal(r[k].code, 'bad_model', `${k}: ${JSON.stringify(r[k])}`);
      assert.ok(r[k].isError && r[k].message.length > 10);
    }
    assert.equal(r.missing.code, 'fetch_failed');
    assert.ok(r.missing.isError, 'errors are KestrelErrors');
    // The web page: named as one, with its URL and Content-Type, before any byte is parsed.
    for (const k of ['html', 'htmlEstimate']) {
      assert.equal(r[k].code, 'bad_model', `${k}: ${JSON.stringify(r[k])}`);
      assert.match(r[k].message, /answered with an HTML page \(Content-Type: text\/html/);
      assert.ok(r[k].message.includes('/tests/browser/page.html'), r[k].message);
    }
    assert.equal(r.savedPage.code, 'bad_model');
    assert.match(r.savedPage.message, /an HTML page or XML document, not the model file/);
    assert.equal(r.tokens, 2);
    assert.equal(r.invalid.code, 'invalid_option');
    assert.match(r.invalid.message, /temperature/);
    for (const [refusal, option] of r.refusals.map((refusal, i) => [refusal, ['temperature', 'temperature', 'top_p', 'max_tokens', 'seed'][i]])) {
      assert.equal(refusal?.code, 'invalid_option', `${option}: ${JSON.stringify(refusal)}`);
      assert.match(refusal.message, new RegExp(`${option}: must be`), refusal.message);
    }
    assert.equal(r.banned, 1);
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

  test('(f) the demo: adapter, will-it-fit, a streamed reply with TTFT and tok/s, a dropped GGUF file, reset (screenshot in tests/artifacts/)', { timeout: 30 * MINUTES }, async () => {
    const page = await env.browser.context.newPage();
    page.setDefaultTimeout(20 * MINUTES);
    page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
    // Every request the demo makes (its worker's included) stays on the page's origin.
    const requests = [];
    page.on('request', (r) => requests.push(r.url()));
    await page.goto(`${env.server.url}/www/demo/?max_tokens=16&context_length=${CONTEXT_LENGTH}`);
    await page.waitForSelector('body[data-ready="true"]');
    assert.match(await page.textContent('#adapter'), /\S/);
    // On SwiftShader, a software adapter, the demo ('auto') runs the model on the CPU and says why.
    assert.match(await page.textContent('#adapter'), /^CPU \(wasm simd128, 1 thread\) · /);
    assert.match(await page.textContent('#backend-reason'), /^Running on the CPU: the WebGPU adapter.* is a software rasterizer\.$/);

    // The adapter panel: what the page's own WebGPU adapter reports.
    const adapter = await page.evaluate(async () => {
      const a = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
      return { features: [...a.features].sort(), maxBufferSize: a.limits.maxBufferSize, maxBinding: a.limits.maxStorageBufferBindingSize };
    });
    const panel = await page.evaluate(() => ({
      features: [...document.querySelectorAll('#gpu-features li')].map((li) => li.textContent),
      maxBufferSize: Number(document.getElementById('gpu-max-buffer').value),
      maxBinding: Number(document.getElementById('gpu-max-binding').value),
    }));
    console.log(`demo adapter panel: ${JSON.stringify(panel)}`);
    assert.ok(adapter.features.length > 0, 'SwiftShader reports no feature');
    assert.deepEqual(panel, adapter);

    // The will-it-fit panel: the package's estimate for the demo's model and context length.
    const shownEstimate = () => page.evaluate(() => ({
      model: document.getElementById('est-model').textContent,
      weight_bytes: Number(document.getElementById('est-weights').value),
      kv_cache_bytes: Number(document.getElementById('est-kv').value),
      largest_binding: Number(document.getElementById('est-largest').value),
      verdict: document.getElementById('est-verdict').textContent,
    }));
    const expected = await page.evaluate(async ({ model, contextLength }) => {
      const { estimate } = await import('/www/index.js');
      const e = await estimate({ model, context_length: contextLength });
      return { weight_bytes: e.weight_bytes, kv_cache_bytes: e.kv_cache_bytes, largest_binding: e.largest_binding.bytes, fits: e.fits };
    }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
    const shown = await shownEstimate();
    console.log(`demo estimate panel: ${JSON.stringify(shown)}`);
    assert.ok(expected.fits);
    assert.equal(shown.verdict, 'fits');
    assert.deepEqual(
      { weight_bytes: shown.weight_bytes, kv_cache_bytes: shown.kv_cache_bytes, largest_binding: shown.largest_binding },
      { weight_bytes: expected.weight_bytes, kv_cache_bytes: expected.kv_cache_bytes, largest_binding: expected.largest_binding },
    );
    assert.ok(expected.weight_bytes > 0 && expected.kv_cache_bytes > 0 && expected.largest_binding > 0);

    await page.click('#gpu summary'); // open the adapter panel for the screenshot
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
    // The reply is shown as rendered Markdown (demo-markdown.test.mjs checks the renderer).
    assert.ok(await page.$('.msg.assistant > *'), 'the reply is rendered Markdown, not raw text');
    assert.match(toks, /^\d+(\.\d+)?$/);
    assert.match(ttft, /^\d+(\.\d+)? s$/);
    await page.click('#stop');
    await page.waitForFunction(() => !document.querySelector('.streaming'));

    // A GGUF file dropped on the page replaces the model.
    const FILE = 'synthetic-qwen3-f32.gguf';
    const accepted = await page.evaluate(async (name) => {
      const data = new DataTransfer();
      data.items.add(new File([await (await fetch(`/models/${name}`)).blob()], name));
      const target = document.getElementById('log');
      const over = new DragEvent('dragover', { dataTransfer: data, bubbles: true, cancelable: true });
      target.dispatchEvent(over);
      target.dispatchEvent(new DragEvent('drop', { dataTransfer: data, bubbles: true, cancelable: true }));
      // A page that does not cancel dragover refuses the drop.
      return over.defaultPrevented;
    }, FILE);
    assert.ok(accepted, 'the page refused the drop');
    await page.waitForFunction((name) => document.getElementById('adapter').textContent.endsWith(`· ${name}`) && document.body.dataset.ready === 'true', FILE);
    const dropped = await shownEstimate();
    console.log(`demo estimate of the dropped file: ${JSON.stringify(dropped)}`);
    assert.ok(dropped.model.startsWith(FILE), dropped.model);
    assert.equal(dropped.verdict, 'fits');
    assert.notEqual(dropped.weight_bytes, shown.weight_bytes);
    assert.equal(await page.evaluate(() => document.getElementById('log').childElementCount), 0);
    await page.fill('#input', 'Hi.');
    await page.click('#send');
    // Random weights: gibberish text, so count tokens.
    await page.waitForFunction(() => Number(document.getElementById('ntok').textContent) >= 2);
    await page.click('#stop');
    await page.waitForFunction(() => !document.querySelector('.streaming'));
    // Reset empties the conversation, and the next reply streams (on the small model: cheaper).
    const logSize = () => page.evaluate(() => document.getElementById('log').childElementCount);
    assert.equal(await logSize(), 2);
    await page.click('#reset');
    assert.equal(await logSize(), 0);
    assert.equal(await page.textContent('#ntok'), '0');
    await page.fill('#input', 'Hello again.');
    await page.click('#send');
    await page.waitForFunction(() => Number(document.getElementById('ntok').textContent) >= 2);
    assert.equal(await page.evaluate(() => document.querySelectorAll('#log .msg.user').length), 1);
    await page.click('#stop');
    await page.waitForFunction(() => !document.querySelector('.streaming'));
    await page.close();
    assert.ok(requests.some((u) => u.endsWith('.gguf')), `the worker's model fetch is among the recorded requests: ${requests}`);
    const elsewhere = requests.filter((u) => new URL(u).origin !== env.server.url);
    assert.deepEqual(elsewhere, [], 'requests to other origins');
  });
});
