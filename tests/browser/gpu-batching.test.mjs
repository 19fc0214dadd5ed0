// Batching on the WebGPU backend (SwiftShader here): with `slots`, concurrent requests on one
// engine decode together, each batched step reading every weight once for all of them (the
// batched variants of matvec.wgsl, per-sequence KV-cache slots, sampling per sequence on the
// GPU). Each request must stream what it streams alone: the same token ids and text, greedy or
// sampled with its own seed, and an aborted one must leave the others untouched.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { assertBatchedAsAlone, MINUTES, openTestPage, runBatchedAndAlone, serveAndLaunch, SMALL_MODEL_URL } from './harness.mjs';

/**
 * The KV cache of both engines: SwiftShader's attention cost grows with it, and these requests
 * need under 40 positions each.
 */
const CONTEXT_LENGTH = 64;

describe('Batching on WebGPU in Chromium', { timeout: 20 * MINUTES }, () => {
  const env = serveAndLaunch();

  test('(m) with slots, concurrent requests on the GPU run as one batch and give what each gives alone', { timeout: 15 * MINUTES }, async () => {
    // The small model: what is checked is the batching. The quantized batched variants are
    // checked against the CPU reference by the native kernel tests, and compiled by Tint in
    // shaders.test.mjs.
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(15 * MINUTES);
    const requests = [
      { prompt: 'The capital of France is', max_tokens: 4 },
      { prompt: 'def fibonacci(n):', max_tokens: 5, temperature: 0.8, seed: 3 },
    ].map((q) => ({ temperature: 0, ignore_eos: true, ...q }));
    const aborted = { prompt: 'Once upon a time', max_tokens: 40, temperature: 0, ignore_eos: true };
    const r = await runBatchedAndAlone(page, { backend: 'webgpu', contextLength: CONTEXT_LENGTH, slots: 3, requests, aborted, model: SMALL_MODEL_URL });
    console.log(`batched on ${r.info.backend}: ${JSON.stringify(r.together.map((t) => t.text))}`);
    assert.equal(r.info.backend, 'webgpu');
    assert.equal(r.info.model.slots, 3);
    assertBatchedAsAlone(r, requests, aborted);
    await page.close();
  });
});
