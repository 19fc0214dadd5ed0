// An AbortSignal stops generation on every backend and slot count `createEngine` can run: 'auto'
// (the CPU backend with one slot on this machine's software adapter, what a page gets on any
// machine without a real GPU), the CPU backend with slots, and WebGPU with one slot and with
// slots. Aborting mid-stream ends it early with finish_reason "abort"; a signal aborted before
// the call ends it before any work on the stepped engines (the CPU backend, any engine with
// slots) and at its first token on WebGPU's single-sequence path.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, openTestPage, serveAndLaunch, SMALL_MODEL_URL } from './harness.mjs';

/** Tokens a request would generate unaborted: far more than an abort lets through. */
const MAX_TOKENS = 400;

// WebGPU's engines load the small model: the abort is what is checked.
const ENGINES = [
  { backend: 'auto', slots: 1, expect: 'cpu', stepped: true, model: MODEL_URL },
  { backend: 'cpu', slots: 2, expect: 'cpu', stepped: true, model: MODEL_URL },
  { backend: 'webgpu', slots: 1, expect: 'webgpu', stepped: false, model: SMALL_MODEL_URL },
  { backend: 'webgpu', slots: 2, expect: 'webgpu', stepped: true, model: SMALL_MODEL_URL },
];

describe('AbortSignal on every backend and slot count', { timeout: 40 * MINUTES }, () => {
  const env = serveAndLaunch();

  for (const { backend, slots, expect, stepped, model } of ENGINES) {
    test(`backend '${backend}' with ${slots} slot${slots > 1 ? 's' : ''}`, { timeout: 10 * MINUTES }, async () => {
      const page = await openTestPage(env.browser.context, env.server.url);
      page.setDefaultTimeout(10 * MINUTES);
      const r = await page.evaluate(async ({ model, backend, slots, contextLength, maxTokens }) => {
        const engine = await window.kestrel.createEngine({ model, backend, slots, context_length: contextLength });
        const request = { prompt: 'A long story about a kestrel:', temperature: 0, max_tokens: maxTokens, ignore_eos: true };
        // Aborted 500 ms after the first token arrived (a timer, as a page's Stop button is).
        const midStream = new AbortController();
        let streamed = 0;
        let finish = null;
        let timer = null;
        for await (const chunk of await engine.completions.create({ ...request, stream: true, signal: midStream.signal })) {
          if (chunk.choices[0]?.token_id != null) {
            streamed++;
            timer ??= setTimeout(() => midStream.abort(), 500);
          }
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        clearTimeout(timer);
        // Aborted before the call, streamed and whole.
        const before = new AbortController();
        before.abort();
        let preStreamed = 0;
        let preFinish = null;
        for await (const chunk of await engine.completions.create({ ...request, stream: true, signal: before.signal })) {
          if (chunk.choices[0]?.token_id != null) preStreamed++;
          preFinish = chunk.choices[0]?.finish_reason ?? preFinish;
        }
        const whole = await engine.completions.create({ ...request, signal: before.signal });
        // The engine answers after the aborts.
        const after = await engine.completions.create({ prompt: 'The sky is', temperature: 0, max_tokens: 3 });
        const info = engine.info;
        await engine.unload();
        return {
          backend: info.backend, slots: info.model.slots, streamed, finish, preStreamed, preFinish,
          whole: { finish: whole.choices[0].finish_reason, tokens: whole.usage.completion_tokens },
          after: { finish: after.choices[0].finish_reason, tokens: after.usage.completion_tokens },
        };
      }, { model, backend, slots, contextLength: CONTEXT_LENGTH, maxTokens: MAX_TOKENS });
      console.log(JSON.stringify(r));
      assert.equal(r.backend, expect);
      assert.equal(r.slots, slots);
      assert.equal(r.finish, 'abort', 'the stream aborted mid-way ended as aborted');
      assert.ok(r.streamed >= 1 && r.streamed < MAX_TOKENS / 2, `${r.streamed} tokens streamed before the abort took effect`);
      assert.equal(r.preFinish, 'abort');
      assert.equal(r.whole.finish, 'abort');
      const most = stepped ? 0 : 1;
      assert.ok(r.preStreamed <= most && r.whole.tokens <= most, `aborted before the call, yet ${r.preStreamed} and ${r.whole.tokens} tokens`);
      assert.deepEqual(r.after, { finish: 'length', tokens: 3 });
      await page.close();
    });
  }
});
