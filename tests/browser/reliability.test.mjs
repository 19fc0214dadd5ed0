// Reliability of the package in Chromium, on the tiny random-weight qwen3 model (fast on
// SwiftShader; written to models/ by `./build.sh test-browser`):
// - a soak of random requests, two in flight at a time, a third of them aborted: none lost, none
//   stuck, each result self-consistent, the KV cache's prefix bookkeeping intact, memory flat;
// - createEngine/unload cycles that leave no worker, JS heap or GPU memory behind;
// - a chat template that never ends, and one whose namespace holds itself (printing it once
//   overflowed the stack and trapped the engine), fail their request with code 'template' and
//   leave the engine answering.
// SOAK_REQUESTS sets the soak's size (default 100), SOAK_SEED its random plan (default fixed),
// LEAK_CYCLES the leak test's cycles (default 5).
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import { CONTEXT_LENGTH, gpuProcessBytes, MINUTES, openTestPage, serveAndLaunch } from './harness.mjs';

const MODEL_URL = '/models/synthetic-qwen3-f32.gguf';
const RUNAWAY_TEMPLATE_URL = '/models/synthetic-qwen3-runaway-template.gguf';
/** Its template: `{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns %}{% endfor %}{{ ns }}`. */
const NAMESPACE_CYCLE_TEMPLATE_URL = '/models/synthetic-qwen3-namespace-cycle-template.gguf';
const REQUESTS = Number(process.env.SOAK_REQUESTS ?? 100);
const SEED = Number(process.env.SOAK_SEED ?? 15);
/** createEngine/unload cycles of the leak test (`./build.sh soak` runs more). */
const LEAK_CYCLES = Number(process.env.LEAK_CYCLES ?? 5);
/**
 * A request still unsettled after this long (queueing included) is stuck: the slowest take
 * about 30 s on SwiftShader on a busy 2-core machine.
 */
const REQUEST_TIMEOUT_MS = 180_000;
const MiB = 1 << 20;

/** mulberry32: a small seeded generator, so a failing plan can be replayed with SOAK_SEED. */
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

const WORDS = ('the a kestrel hovers over field and wind sky hunts mouse bird small falcon wings '
  + 'tail feathers grass river morning light sees dives quickly slowly above under green brown').split(' ');
// Short, common pieces, so that random text often contains them and stop strings do stop it.
const STOPS = ['e', ' t', '.', '\n', 'an', ',', 'ing', 'the'];

/** The soak's requests: kind, prompt, options, streaming, and where (if at all) to abort. */
function plan(count, seed) {
  const r = random(seed);
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
  const words = (n) => Array.from({ length: n }, () => pick(WORDS));
  let previous = words(8);
  return Array.from({ length: count }, () => {
    // Some prompts extend the previous one, so the cached prefix is reused, not only replaced.
    const prompt = r() < 0.3 && previous.length < 40 ? [...previous, ...words(int(1, 10))] : words(int(1, 40));
    previous = prompt;
    const options = { max_tokens: int(1, 16) };
    if (r() < 0.3) options.temperature = 0;
    else {
      options.temperature = pick([0.3, 0.7, 1, 1.5]);
      options.seed = int(0, 2 ** 31);
      if (r() < 0.5) options.top_k = pick([0, 1, 5, 40]);
      if (r() < 0.5) options.top_p = pick([0.5, 0.9, 1]);
      if (r() < 0.3) options.min_p = pick([0, 0.1]);
    }
    if (r() < 0.3) options.repetition_penalty = pick([1.1, 1.3]);
    if (r() < 0.3) options.frequency_penalty = pick([-0.5, 0.5, 1]);
    if (r() < 0.3) options.presence_penalty = pick([-0.5, 0.5, 1]);
    if (r() < 0.2) options.penalty_last_n = int(0, 64);
    if (r() < 0.3) options.stop = r() < 0.5 ? pick(STOPS) : [pick(STOPS), pick(STOPS)];
    if (r() < 0.2) options.ignore_eos = true;
    if (r() < 0.2) {
      options.logprobs = true;
      options.top_logprobs = int(1, 5);
    }
    const stream = r() < 0.5;
    let abort = null;
    if (r() < 1 / 3) {
      const at = r();
      // While queued behind the other request, after some streamed tokens, or after some time.
      if (at < 0.2) abort = { queued: true };
      else if (stream && at < 0.6) abort = { afterTokens: int(1, options.max_tokens) };
      else abort = { afterMs: int(0, 3000) };
    }
    return { kind: r() < 0.5 ? 'chat' : 'text', prompt: prompt.join(' '), options, stream, abort };
  });
}

/** The fixed greedy request that checks the KV cache's bookkeeping. */
const FIXED = { prompt: 'the kestrel hovers over the field and', temperature: 0, max_tokens: 8, ignore_eos: true };

describe('reliability in Chromium', { timeout: 30 * MINUTES }, () => {
  const env = serveAndLaunch();
  let page;
  let cdp;

  before(async () => {
    page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(20 * MINUTES);
    cdp = await env.browser.context.newCDPSession(page);
    await cdp.send('Performance.enable');
  });

  /** The page's JS heap in use after a full garbage collection. */
  async function jsHeapBytes() {
    await cdp.send('HeapProfiler.collectGarbage');
    const { metrics } = await cdp.send('Performance.getMetrics');
    return metrics.find((m) => m.name === 'JSHeapUsedSize').value;
  }

  test(`soak: ${REQUESTS} random requests two at a time, a third aborted (seed ${SEED})`, { timeout: 20 * MINUTES }, async () => {
    const requests = plan(REQUESTS, SEED);
    const t0 = Date.now();
    const r = await page.evaluate(async ({ modelUrl, contextLength, requests, fixed, timeoutMs }) => {
      const engine = await window.kestrel.createEngine({ model: modelUrl, context_length: contextLength });
      const greedy = async (e) => {
        const out = await e.completions.create(fixed);
        return { text: out.choices[0].text, ids: out.kestrel.token_ids, reused: out.usage.extra.reused_tokens };
      };

      async function run({ kind, prompt, options, stream, abort }) {
        const controller = abort ? new AbortController() : null;
        const request = { ...options, stream, signal: controller?.signal };
        if (kind === 'chat') request.messages = [{ role: 'user', content: prompt }];
        else request.prompt = prompt;
        const create = kind === 'chat' ? engine.chat.completions.create : engine.completions.create;
        const timer = abort?.afterMs != null ? setTimeout(() => controller.abort(), abort.afterMs) : null;
        try {
          const pending = create(request);
          if (abort?.queued) controller.abort();
          if (!stream) {
            const out = await pending;
            const c = out.choices[0];
            return { finish: c.finish_reason, text: c.message?.content ?? c.text, usage: out.usage, kestrel: out.kestrel };
          }
          let text = '';
          const streamed = [];
          let last;
          for await (const chunk of await pending) {
            const c = chunk.choices[0];
            text += c.delta?.content ?? c.text ?? '';
            if (c.token_id != null) streamed.push(c.token_id);
            if (abort?.afterTokens === streamed.length && c.token_id != null) controller.abort();
            last = chunk;
          }
          return { finish: last.choices[0].finish_reason, text, streamed, usage: last.usage, kestrel: last.kestrel };
        } catch (e) {
          return { error: { code: e.code, message: e.message } };
        } finally {
          clearTimeout(timer);
        }
      }

      const before = { greedy: await greedy(engine), memory: await engine.memory() };
      const results = new Array(requests.length);
      let next = 0;
      // Two requests in flight at a time: the engine queues the second behind the first.
      const lane = async () => {
        while (next < requests.length) {
          const i = next++;
          let timer;
          const stuck = new Promise((resolve) => (timer = setTimeout(() => resolve({ stuck: true }), timeoutMs)));
          results[i] = await Promise.race([run(requests[i]), stuck]);
          clearTimeout(timer);
        }
      };
      const soakStart = performance.now();
      await Promise.all([lane(), lane()]);
      const soakMs = performance.now() - soakStart;
      const after = { memory: await engine.memory(), greedy: await greedy(engine), again: await greedy(engine) };
      await engine.unload();
      const fresh = await window.kestrel.createEngine({ model: modelUrl, context_length: contextLength });
      const freshGreedy = await greedy(fresh);
      await fresh.unload();
      return { before, after, freshGreedy, results, soakMs };
    }, { modelUrl: MODEL_URL, contextLength: CONTEXT_LENGTH, requests, fixed: FIXED, timeoutMs: REQUEST_TIMEOUT_MS });
    const seconds = (Date.now() - t0) / 1e3;

    const where = (i) => `request ${i} of seed ${SEED} (${JSON.stringify(requests[i])}): ${JSON.stringify(r.results[i])}`;
    const count = { aborted: 0, abortedEarly: 0, stuck: 0, errors: 0, tokens: 0, finish: {} };
    r.results.forEach((res, i) => {
      const req = requests[i];
      if (res.stuck) count.stuck++;
      if (res.error) count.errors++;
      assert.ok(!res.stuck, `stuck (unsettled after ${REQUEST_TIMEOUT_MS} ms): ${where(i)}`);
      // Aborting resolves with finish_reason "abort" (or the natural end, where the abort came
      // after it); nothing fails.
      assert.ok(!res.error, `failed: ${where(i)}`);
      count.finish[res.finish] = (count.finish[res.finish] ?? 0) + 1;
      if (req.abort) count.aborted++;
      if (res.finish === 'abort') {
        assert.ok(req.abort, `finish_reason abort without an abort: ${where(i)}`);
        count.abortedEarly++;
      } else {
        assert.ok(['stop', 'length'].includes(res.finish), `finish_reason: ${where(i)}`);
      }
      const { usage, kestrel } = res;
      const ids = kestrel.token_ids;
      count.tokens += ids.length;
      assert.ok(ids.length <= req.options.max_tokens, `more tokens than max_tokens: ${where(i)}`);
      if (res.finish === 'length') assert.equal(ids.length, req.options.max_tokens, `length before max_tokens: ${where(i)}`);
      assert.equal(usage.completion_tokens, ids.length, `usage.completion_tokens: ${where(i)}`);
      assert.equal(usage.prompt_tokens, kestrel.prompt_token_ids.length, `usage.prompt_tokens: ${where(i)}`);
      assert.equal(usage.extra.prefill_tokens + usage.extra.reused_tokens, usage.prompt_tokens, `prefill + reused: ${where(i)}`);
      // The package exposes token ids but no decoder: the streamed ids are the result's, and
      // each log-probability belongs to its token.
      if (req.stream) assert.deepEqual(res.streamed, ids, `streamed token ids differ from the result's: ${where(i)}`);
      if (req.options.logprobs) {
        assert.deepEqual(kestrel.logprobs.map((l) => l.token_id), ids, `logprobs' tokens: ${where(i)}`);
        for (const l of kestrel.logprobs) assert.equal(l.top.length, req.options.top_logprobs, `top_logprobs: ${where(i)}`);
      }
      const stops = [req.options.stop ?? []].flat();
      for (const s of stops) assert.ok(!res.text.includes(s), `the stop string ${JSON.stringify(s)} is in the text: ${where(i)}`);
    });
    const { before, after, freshGreedy } = r;
    console.log(`soak (seed ${SEED}): ${REQUESTS} requests in ${(r.soakMs / 1e3).toFixed(1)} s (${seconds.toFixed(1)} s with the loads and checks), ${count.tokens} tokens; `
      + `${count.aborted} aborted (${count.abortedEarly} stopped early), lost ${count.errors}, stuck ${count.stuck}; `
      + `finish reasons ${JSON.stringify(count.finish)}`);
    console.log(`memory before ${JSON.stringify(before.memory)}, after ${JSON.stringify(after.memory)}`);
    console.log(`fixed greedy request: ${JSON.stringify(freshGreedy.text)}; reused after the soak: ${after.greedy.reused}, again: ${after.again.reused}`);
    assert.ok(count.aborted > 0 && count.aborted < REQUESTS, `seed ${SEED} aborts ${count.aborted} requests`);
    // Prefix bookkeeping: after the soak (partly reused prefix), and again (the whole prompt
    // reused), the fixed request gives what a fresh engine gives.
    assert.ok(after.again.reused > 0, 'the repeated request reused nothing from the cache');
    for (const [label, g] of [['before the soak', before.greedy], ['after the soak', after.greedy], ['repeated', after.again]]) {
      assert.deepEqual(g.ids, freshGreedy.ids, `seed ${SEED}: the fixed request's tokens ${label} differ from a fresh engine's`);
      assert.equal(g.text, freshGreedy.text, `seed ${SEED}: the fixed request's text ${label} differs from a fresh engine's`);
    }
    // Memory flat: the wasm heap grows only for a larger peak allocation, never per request.
    assert.ok(after.memory.wasm_bytes - before.memory.wasm_bytes <= 2 * MiB, `seed ${SEED}: wasm memory grew from ${before.memory.wasm_bytes} to ${after.memory.wasm_bytes} bytes`);
    assert.ok(after.memory.gpu_buffer_bytes <= before.memory.gpu_buffer_bytes, `seed ${SEED}: live GPU buffers grew from ${JSON.stringify(before.memory)} to ${JSON.stringify(after.memory)}`);
  });

  /** Polls `get()` until `done(value)` or `ms` pass; returns the last value. */
  async function waitFor(get, done, ms) {
    const end = Date.now() + ms;
    let value = get();
    while (!done(value) && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 100));
      value = get();
    }
    return value;
  }

  test(`no leaks: ${LEAK_CYCLES} createEngine/unload cycles`, { timeout: 10 * MINUTES }, async () => {
    const cycles = [];
    for (let i = 0; i < LEAK_CYCLES; i++) {
      const loaded = await page.evaluate(async ({ modelUrl, contextLength }) => {
        const engine = await window.kestrel.createEngine({ model: modelUrl, context_length: contextLength });
        await engine.completions.create({ prompt: 'the kestrel', max_tokens: 2, temperature: 0 });
        const memory = await engine.memory();
        await engine.unload();
        return memory;
      }, { modelUrl: MODEL_URL, contextLength: CONTEXT_LENGTH });
      // The worker's end reaches the page's worker list a moment after terminate().
      const workers = await waitFor(() => page.workers().length, (n) => n === 0, 10_000);
      cycles.push({ loaded, workers, jsHeap: await jsHeapBytes(), gpuProcess: gpuProcessBytes(env.browser) });
    }
    for (const [i, c] of cycles.entries()) {
      console.log(`cycle ${i + 1}: loaded ${JSON.stringify(c.loaded)}; after unload: ${c.workers} workers, page JS heap ${(c.jsHeap / MiB).toFixed(2)} MiB, GPU process ${(c.gpuProcess / MiB).toFixed(1)} MiB`);
    }
    const [first, last] = [cycles[0], cycles.at(-1)];
    const modelBytes = first.loaded.gpu_buffer_bytes;
    for (const c of cycles) {
      assert.equal(c.workers, 0, 'unload left the worker running');
      // Each engine holds what the first did, give or take the load's small staging buffers
      // still awaiting the garbage collector, and the heap's layout.
      assert.ok(Math.abs(c.loaded.gpu_buffer_bytes - modelBytes) < MiB, `loaded engines differ: ${JSON.stringify(c.loaded)} and ${JSON.stringify(first.loaded)}`);
      assert.ok(Math.abs(c.loaded.wasm_bytes - first.loaded.wasm_bytes) < 4 * MiB, `loaded engines differ: ${JSON.stringify(c.loaded)} and ${JSON.stringify(first.loaded)}`);
    }
    // Flat after the first cycle: a leak of one engine's GPU buffers per cycle would add
    // LEAK_CYCLES - 1 times their size; allocator slack stays well under one.
    assert.ok(last.gpuProcess - first.gpuProcess < modelBytes / 2, `the GPU process grew from ${first.gpuProcess} to ${last.gpuProcess} bytes (one engine's buffers: ${modelBytes})`);
    assert.ok(last.jsHeap - first.jsHeap < MiB, `the page's JS heap grew from ${first.jsHeap} to ${last.jsHeap} bytes`);
  });

  test("a runaway chat template fails with 'template' and the engine still answers", { timeout: 5 * MINUTES }, async () => {
    const r = await page.evaluate(async ({ modelUrl, contextLength }) => {
      const engine = await window.kestrel.createEngine({ model: modelUrl, context_length: contextLength });
      const t0 = performance.now();
      let error = null;
      try {
        await engine.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
      } catch (e) {
        error = { code: e.code, message: e.message };
      }
      const ms = performance.now() - t0;
      const out = await engine.completions.create({ prompt: 'the kestrel', max_tokens: 2, temperature: 0, ignore_eos: true });
      await engine.unload();
      return { error, ms, after: out.kestrel.token_ids.length };
    }, { modelUrl: RUNAWAY_TEMPLATE_URL, contextLength: CONTEXT_LENGTH });
    console.log(`runaway template: ${JSON.stringify(r.error)} after ${r.ms.toFixed(0)} ms; then ${r.after} tokens of a text prompt`);
    assert.equal(r.error?.code, 'template');
    // Bounded: natively the render gives up after ~0.3 s; wasm on a loaded machine is slower.
    assert.ok(r.ms < 30_000, `the template ran ${r.ms} ms before failing`);
    assert.equal(r.after, 2);
  });

  test("a chat template whose namespace holds itself fails with 'template', and the engine does not crash", { timeout: 5 * MINUTES }, async () => {
    const r = await page.evaluate(async ({ modelUrl, contextLength }) => {
      const statuses = [];
      const engine = await window.kestrel.createEngine({ model: modelUrl, context_length: contextLength, onStatus: (s) => statuses.push(s.status) });
      let error = null;
      try {
        await engine.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
      } catch (e) {
        error = { code: e.code, message: e.message };
      }
      const out = await engine.completions.create({ prompt: 'the kestrel', max_tokens: 2, temperature: 0, ignore_eos: true });
      await engine.unload();
      return { error, statuses, after: out.kestrel.token_ids.length };
    }, { modelUrl: NAMESPACE_CYCLE_TEMPLATE_URL, contextLength: CONTEXT_LENGTH });
    console.log(`namespace cycle: ${JSON.stringify(r.error)}; then ${r.after} tokens of a text prompt; statuses ${JSON.stringify(r.statuses)}`);
    assert.equal(r.error?.code, 'template');
    assert.match(r.error.message, /contains the namespace/);
    assert.equal(r.after, 2);
    assert.deepEqual(r.statuses, [], 'the engine reported a crash (or another status)');
  });
});
