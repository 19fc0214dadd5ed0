// The CPU backend in the browser (kestrel-cpu's kernels in wasm SIMD, in the engine's worker):
// chosen by createEngine's default 'auto' where the WebGPU adapter is a software one (SwiftShader
// here) or WebGPU is missing, with the reason in `engine.info`; it streams llama.cpp's greedy
// tokens for the default model (llama.cpp rounds activations to 8 bits as it does) up to the first
// step whose top two logits are within the CPU backend's near-tie bound.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { assertBatchedAsAlone, CONTEXT_LENGTH, launch, MINUTES, MODEL_URL, openTestPage, ROOT, runBatchedAndAlone, serveAndLaunch } from './harness.mjs';

/** The llama.cpp margin under which a CPU-backend step may flip: its 8-bit activations round as
 * llama.cpp's do but after sums in another order, so an activation at a level boundary can round
 * the other way (`CPU_NEAR_TIE` in crates/kestrel-model/tests/greedy.rs, which measures it: a step
 * 0.17 apart flips with the summation order alone). */
const CPU_NEAR_TIE = 0.25;

/** llama.cpp's greedy run of a prompt of the default model, compared up to its first near-tie. */
function reference(promptId) {
  const greedy = JSON.parse(readFileSync(join(ROOT, 'tests/data/reference/greedy.json'), 'utf8'));
  const prompts = JSON.parse(readFileSync(join(ROOT, 'tests/data/reference/prompts.json'), 'utf8'));
  const want = greedy.prompts.find((p) => p.id === promptId);
  const firstTie = want.step_top1_top2_logit_margin.findIndex((m) => m < CPU_NEAR_TIE);
  const steps = firstTie === -1 ? want.greedy_ids.length : firstTie;
  return { messages: prompts.prompts.find((p) => p.id === promptId).messages, want, steps };
}

describe('The CPU backend in Chromium', { timeout: 30 * MINUTES }, () => {
  const env = serveAndLaunch();

  test("(i) 'auto' on a software adapter runs on the CPU and streams llama.cpp's greedy tokens", { timeout: 15 * MINUTES }, async () => {
    // The reference prompt with the most steps before a CPU near-tie (every raw one has one by
    // its second step).
    const { messages, want, steps } = reference('pub_chat_math');
    assert.ok(steps >= 6, `only ${steps} steps before llama.cpp's first near-tie`);
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(10 * MINUTES);
    const out = await page.evaluate(async ({ model, messages, steps, contextLength }) => {
      const engine = await window.kestrel.createEngine({ model, backend: 'auto', context_length: contextLength });
      const info = engine.info;
      const pieces = [];
      let last = null;
      for await (const chunk of await engine.chat.completions.create({ messages, temperature: 0, max_tokens: steps, ignore_eos: true, stream: true })) {
        if (chunk.choices[0]?.delta?.content) pieces.push(chunk.choices[0].delta.content);
        last = chunk;
      }
      await engine.unload();
      return { info, text: pieces.join(''), kestrel: last.kestrel, usage: last.usage };
    }, { model: MODEL_URL, messages, steps, contextLength: CONTEXT_LENGTH });
    const x = out.usage.extra;
    console.log(`CPU backend: ${out.info.backend_reason}; ${out.info.cpu.simd}, ${out.info.cpu.threads} thread; prefill ${x.prefill_tokens_per_s.toFixed(1)} tok/s, decode ${x.decode_tokens_per_s.toFixed(1)} tok/s`);
    assert.equal(out.info.backend, 'cpu');
    assert.match(out.info.backend_reason, /software rasterizer/);
    assert.equal(out.info.cpu.simd, 'simd128', 'the package is built with wasm SIMD');
    assert.equal(out.info.gpu, null);
    assert.deepEqual(out.kestrel.prompt_token_ids, want.prompt_ids);
    assert.deepEqual(out.kestrel.token_ids, want.greedy_ids.slice(0, steps), `the first ${steps} greedy tokens differ from llama.cpp's`);
    assert.ok(out.text.length > 0);
    await page.close();
  });

  test("(j) without a WebGPU adapter, 'auto' and 'cpu' run on the CPU, 'webgpu' fails with no_webgpu", { timeout: 10 * MINUTES }, async () => {
    const browser = await launch({ webgpu: false });
    try {
      const page = await openTestPage(browser.context, env.server.url);
      page.setDefaultTimeout(5 * MINUTES);
      const r = await page.evaluate(async ({ model, contextLength }) => {
        const { createEngine } = window.kestrel;
        const code = (p) => p.then(() => null, (e) => e.code);
        const results = { adapter: Boolean(await navigator.gpu?.requestAdapter()) };
        for (const backend of ['auto', 'cpu']) {
          const engine = await createEngine({ model, backend, context_length: contextLength });
          const out = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }], temperature: 0, max_tokens: 3 });
          results[backend] = { backend: engine.info.backend, reason: engine.info.backend_reason, tokens: out.usage.completion_tokens };
          await engine.unload();
        }
        results.webgpu = await code(createEngine({ model, backend: 'webgpu' }));
        results.bad = await code(createEngine({ model, backend: 'gpu' }));
        return results;
      }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
      console.log(JSON.stringify(r));
      assert.equal(r.adapter, false, 'this browser has a WebGPU adapter');
      assert.deepEqual(r.auto, { backend: 'cpu', reason: r.auto.reason, tokens: 3 });
      assert.match(r.auto.reason, /^no WebGPU device: .*adapter/);
      assert.deepEqual(r.cpu, { backend: 'cpu', reason: "backend 'cpu' was asked for", tokens: 3 });
      assert.equal(r.webgpu, 'no_webgpu');
      assert.equal(r.bad, 'invalid_option');
    } finally {
      await browser.close();
    }
  });
  test('(k) with slots, concurrent requests on the CPU run as one batch and give what each gives alone', { timeout: 15 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(10 * MINUTES);
    const requests = [
      { prompt: 'The capital of France is', max_tokens: 8 },
      { prompt: 'Once upon a time', max_tokens: 10 },
      { prompt: 'def fibonacci(n):', max_tokens: 12, temperature: 0.8, seed: 3 },
    ].map((q) => ({ temperature: 0, ignore_eos: true, ...q }));
    const aborted = { prompt: 'A long story:', max_tokens: 200, temperature: 0, ignore_eos: true };
    const r = await runBatchedAndAlone(page, { backend: 'cpu', contextLength: CONTEXT_LENGTH, slots: 4, requests, aborted });
    assert.equal(r.info.backend, 'cpu');
    assert.equal(r.info.model.slots, 4);
    assertBatchedAsAlone(r, requests, aborted);
    const badSlots = await page.evaluate((model) => window.kestrel.createEngine({ model, backend: 'cpu', slots: 0 }).then(() => null, (e) => e.code), MODEL_URL);
    assert.equal(badSlots, 'invalid_option');
    await page.close();
  });
});
