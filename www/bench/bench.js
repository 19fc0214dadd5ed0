// The suite's workload in the browser, for Kestrel (the package in ../index.js) and for the
// peer wllama (llama.cpp in wasm; served from ./vendor/, copied there by bench/browser.mjs):
// cold load, warm load, then for each prompt `repeats` generations of `decodeTokens` greedy
// steps after the first token from an empty KV cache, timing every streamed token on the main
// thread and watching the main thread meanwhile. Every time is in ms, every rate in tok/s.
import { createEngine, deleteModelFromCache } from '../index.js';
import { measureMemory, watchMainThread } from './monitor.js';
import { hookWorkers, wasmHeapBytes } from './wasm-heap.js';

/**
 * @import { ChatCompletionChunk, ChatMessage, CreateEngineOptions, Engine, ResponseFormat, Usage } from '../index.d.ts'
 */

/**
 * The workload (bench/browser.mjs's): each prompt's text and its length in tokens, the decode
 * steps after the first token, and the generations of each prompt.
 * @typedef {{ prompts: { prompt_tokens: number, text: string }[], decodeTokens: number, repeats: number }} Workload
 */

/**
 * One engine's generation of `text` (`maxTokens`), calling `onToken` as each token reaches the
 * page: resolves to the prompt tokens it ran, and its longest GPU submission where it reports one.
 * @typedef {(text: string, maxTokens: number, onToken: () => void) => Promise<{ prompt_tokens: number, longest_submission_ms?: number | null }>} Generate
 */

/**
 * The part of wllama's API this page uses (its module is vendored into ./vendor/ by
 * bench/browser.mjs, and not in the repository).
 * @typedef {{
 *   loadModelFromUrl(url: string, options: { n_ctx: number, n_threads: number, n_gpu_layers: number, useCache: boolean }): Promise<void>,
 *   createCompletion(options: Record<string, unknown>): Promise<AsyncIterable<{ timings?: { cache_n: number, prompt_n: number }, choices?: unknown[] }>>,
 *   isMultithread(): boolean,
 *   getNumThreads(): number,
 *   exit(): Promise<void>,
 * }} Wllama
 */

// Before any engine starts its worker: each engine's wasm heap is then measured the same way.
hookWorkers();

const WLLAMA_URL = './vendor/wllama/index.js';
const WLLAMA_WASM = new URL('./vendor/wllama/wllama.wasm', import.meta.url).href;

/**
 * Runs `generate(text, maxTokens, onToken)` (resolving to {prompt_tokens, longest_submission_ms}:
 * the prompt tokens the engine ran, and its longest GPU submission of them where it reports one)
 * for each prompt, `repeats` times. Every engine is timed the same way, by when its
 * tokens reach the page: TTFT from the request to the first token, decode over the steps after.
 * @param {Workload} workload
 * @param {Generate} generate
 */
async function runWorkload({ prompts, decodeTokens, repeats }, generate) {
  const results = [];
  const watch = await watchMainThread();
  for (const { prompt_tokens: wanted, text } of prompts) {
    const runs = [];
    for (let r = 0; r < repeats; r += 1) {
      /** @type {number[]} */
      const times = [];
      const start = performance.now();
      const reported = await generate(text, decodeTokens + 1, () => times.push(performance.now()));
      checkStreamed(times, decodeTokens + 1);
      const itl = times.slice(1).map((t, i) => t - times[i]);
      const ttft = times[0] - start;
      const decodeMs = times[times.length - 1] - times[0];
      const run = {
        prompt_tokens: reported.prompt_tokens,
        longest_submission_ms: reported.longest_submission_ms ?? null,
        ttft_ms: ttft,
        prefill_tok_s: reported.prompt_tokens / (ttft / 1e3),
        decode_tok_s: decodeTokens / (decodeMs / 1e3),
        itl_ms: itl,
      };
      runs.push(run);
      console.log(`prompt ${wanted}: repeat ${r + 1}/${repeats}: TTFT ${ttft.toFixed(0)} ms, decode ${run.decode_tok_s.toFixed(2)} tok/s`);
    }
    results.push({ prompt_tokens: wanted, decode_tokens: decodeTokens, repeats, runs });
  }
  return { workloads: results, main_thread: watch.stop() };
}

/**
 * Throws unless the engine streamed the `asked` tokens, each timed in `times`.
 * @param {number[]} times
 * @param {number} asked
 */
function checkStreamed(times, asked) {
  if (times.length !== asked) throw new Error(`asked for ${asked} tokens, the engine streamed ${times.length}`);
}

/**
 * Streams Kestrel's greedy completion of `text` (`maxTokens`, past any end of text), calling
 * `onToken` as each token reaches the page; resolves to the usage its last chunk carries.
 * @param {Engine} engine
 * @param {string} text
 * @param {number} maxTokens
 * @param {() => void} onToken
 * @returns {Promise<Usage>}
 */
async function streamGreedy(engine, text, maxTokens, onToken) {
  /** @type {Usage | null} */
  let usage = null;
  const stream = await engine.completions.create({ prompt: text, stream: true, max_tokens: maxTokens, temperature: 0, ignore_eos: true });
  for await (const chunk of stream) {
    if (chunk.choices[0]?.token_id != null) onToken();
    if (chunk.usage) usage = chunk.usage;
  }
  if (!usage) throw new Error('the last chunk carried no usage');
  return usage;
}

/**
 * Kestrel on `backend` ('webgpu' or 'cpu'): cold load (Cache API emptied first), the workload,
 * then a warm load from the cache.
 * @param {Workload & { modelUrl: string, backend: CreateEngineOptions['backend'] }} options
 */
export async function runKestrel({ modelUrl, prompts, decodeTokens, repeats, backend }) {
  await deleteModelFromCache(new URL(modelUrl, location.href).href);
  let t = performance.now();
  const engine = await createEngine({ model: modelUrl, backend });
  const coldLoadMs = performance.now() - t;
  /** @type {Generate} */
  const generate = async (text, maxTokens, onToken) => {
    // Each repeat from an empty cache: otherwise the engine reuses the previous prompt's prefix.
    await engine.reset();
    const usage = await streamGreedy(engine, text, maxTokens, onToken);
    const longest = usage.extra.longest_prefill_submission_s;
    return { prompt_tokens: usage.extra.prefill_tokens, longest_submission_ms: longest == null ? null : longest * 1e3 };
  };
  const result = await runWorkload({ prompts, decodeTokens, repeats }, generate);
  const memory = await measureMemory();
  const wasmHeap = await wasmHeapBytes();
  const info = engine.info;
  await engine.unload();
  t = performance.now();
  const warm = await createEngine({ model: modelUrl, backend });
  const warmLoadMs = performance.now() - t;
  await warm.unload();
  return { engine: 'kestrel', backend: info.backend, cpu: info.cpu, version: info.version, gpu: info.gpu, model: info.model, cold_load_ms: coldLoadMs, warm_load_ms: warmLoadMs, memory, wasm_heap_bytes: wasmHeap, ...result };
}

/**
 * Kestrel's batching: for each B of `batchSizes`, `repeats` times, B concurrent requests for the
 * same prompt on one engine with `slots` for the largest B ('auto': the WebGPU backend on a real
 * GPU, the CPU backend on a software adapter). The rate counts every request's tokens that reach
 * the page while all B decode, from the last request's first token to the first request's last
 * one, so prompts being prefilled and requests already done count for nothing. Resolves to the
 * engine's backend and, per B, the rate of each repeat.
 * @param {Workload & { modelUrl: string, batchSizes: number[], backend: CreateEngineOptions['backend'] }} options
 */
export async function runKestrelBatch({ modelUrl, prompts, decodeTokens, repeats, batchSizes, backend }) {
  const engine = await createEngine({ model: modelUrl, backend, slots: Math.max(...batchSizes) });
  const text = prompts[0].text;
  const stream = async () => {
    /** @type {number[]} */
    const times = [];
    await streamGreedy(engine, text, decodeTokens + 1, () => times.push(performance.now()));
    checkStreamed(times, decodeTokens + 1);
    return times;
  };
  const batches = [];
  for (const batch of batchSizes) {
    const rates = [];
    for (let r = 0; r < repeats; r += 1) {
      const streams = await Promise.all(Array.from({ length: batch }, stream));
      const from = Math.max(...streams.map((t) => t[0]));
      const to = Math.min(...streams.map((t) => t[t.length - 1]));
      if (to <= from) throw new Error(`batch ${batch}: a request ended before another's first token`);
      const tokens = streams.reduce((n, t) => n + t.filter((x) => x > from && x <= to).length, 0);
      const rate = tokens / ((to - from) / 1e3);
      rates.push(rate);
      console.log(`batch ${batch}: repeat ${r + 1}/${repeats}: ${rate.toFixed(2)} tok/s`);
    }
    batches.push({ batch, decode_tok_s: rates });
  }
  const info = engine.info;
  await engine.unload();
  return { backend: info.backend, cpu: info.cpu, prompt_tokens: prompts[0].prompt_tokens, decode_tokens: decodeTokens, repeats, batches };
}

/**
 * Structured output in the page, as `kestrel bench constrained` measures it natively: the chat
 * prompt `ask` answered greedy under `schema` (to its end), then free decode of as many tokens
 * (`ignore_eos`), alternating for `repeats` rounds; the decode rates are the engine's own
 * (usage.extra). Resolves to the backend, the answer's tokens and each round's rates.
 * @param {{ modelUrl: string, schema: Record<string, unknown>, ask: string, repeats: number, backend: CreateEngineOptions['backend'] }} options
 */
export async function runKestrelConstrained({ modelUrl, schema, ask, repeats, backend }) {
  const engine = await createEngine({ model: modelUrl, backend });
  /** @type {ChatMessage[]} */
  const messages = [{ role: 'system', content: 'Answer in JSON.' }, { role: 'user', content: ask }];
  /** @type {ResponseFormat} */
  const response_format = { type: 'json_schema', json_schema: { name: 'bench', schema, strict: true } };
  /** @type {number[]} */
  const held = [];
  /** @type {number[]} */
  const free = [];
  let tokens = 0;
  /** @type {string | null} */
  let answer = '';
  for (let r = 0; r < repeats; r += 1) {
    const c = await engine.chat.completions.create({ messages, response_format, temperature: 0, max_tokens: 256 });
    if (c.choices[0].finish_reason !== 'stop') throw new Error(`the constrained answer did not end within 256 tokens: ${c.choices[0].message.content}`);
    answer = c.choices[0].message.content;
    JSON.parse(String(answer)); // as JSON.parse(null) reads it: 'null'
    tokens = c.usage.completion_tokens;
    held.push(c.usage.extra.decode_tokens_per_s);
    const f = await engine.chat.completions.create({ messages, temperature: 0, max_tokens: tokens, ignore_eos: true });
    free.push(f.usage.extra.decode_tokens_per_s);
  }
  const info = engine.info;
  await engine.unload();
  return { backend: info.backend, cpu: info.cpu, tokens, answer, constrained_tok_s: held, free_tok_s: free };
}

/**
 * Streams the greedy answer to `text` as one user message (at most `maxTokens`, ending where the
 * model ends it), from position 0, plainly or with the engine's speculative decoding, timing each
 * token as it reaches the page. Decode tok/s: the tokens after the first over the time from the
 * first to the last (null for an answer of one token).
 * @param {Engine} engine
 * @param {string} text
 * @param {number} maxTokens
 * @param {boolean} speculative
 */
async function timedChat(engine, text, maxTokens, speculative) {
  // Each run from an empty cache: otherwise the second of a pair reuses the first's prompt.
  await engine.reset();
  /** @type {number[]} */
  const times = [];
  let answer = '';
  /** @type {ChatCompletionChunk['kestrel']} */
  let details;
  /** @type {Usage | undefined} */
  let usage;
  const stream = await engine.chat.completions.create({ messages: [{ role: 'user', content: text }], stream: true, max_tokens: maxTokens, temperature: 0, speculative });
  for await (const chunk of stream) {
    if (chunk.choices[0]?.token_id != null) times.push(performance.now());
    answer += chunk.choices[0]?.delta.content ?? '';
    details ??= chunk.kestrel;
    usage ??= chunk.usage;
  }
  if (!details || !usage) throw new Error('the last chunk carried no kestrel details or usage');
  // Every token must have come as its own chunk, or the rate would count the wrong tokens.
  if (times.length !== details.token_ids.length) throw new Error(`${details.token_ids.length} tokens generated, ${times.length} streamed`);
  if (usage.extra.reused_tokens > 0) throw new Error(`the engine reused ${usage.extra.reused_tokens} cached prompt tokens after reset()`);
  if (!speculative && details.speculative) throw new Error('a request with speculative: false speculated');
  const decodeMs = times[times.length - 1] - times[0];
  return {
    tokens: times.length,
    decode_tok_s: times.length > 1 && decodeMs > 0 ? (times.length - 1) / (decodeMs / 1e3) : null,
    // What lookup drafted and kept (absent where speculative decoding did not serve the request).
    speculative: speculative ? details.speculative ?? { drafted: 0, accepted: 0, verifications: 0 } : null,
    text: answer,
    token_ids: details.token_ids,
  };
}

/**
 * Speculative decoding in the page, as `kestrel bench model --lookup` measures it natively: on
 * the wasm CPU backend with prompt lookup (`maxDraft` tokens a draft), each workload's chat
 * prompts greedy, at most `maxTokens` new tokens, plain (`speculative: false`) and with lookup
 * alternately, which goes first alternating per prompt and repeat, `repeats` pairs per prompt.
 * Resolves to the engine's backend and, per workload, every pair's runs.
 * @param {{ modelUrl: string, workloads: Record<string, string[]>, maxTokens: number, maxDraft: number, repeats: number }} options
 */
export async function runKestrelSpeculative({ modelUrl, workloads, maxTokens, maxDraft, repeats }) {
  const engine = await createEngine({ model: modelUrl, backend: 'cpu', speculative: { lookup: true, maxDraft } });
  const { backend, cpu, speculative } = engine.info;
  if (!speculative?.enabled) throw new Error(`the engine does not speculate: ${JSON.stringify(speculative)}`);
  // Untimed and short (its prefill runs the kernels lookup's verifications run, its decode the
  // plain steps'), so that the first timed run does not pay for the engine's first calls.
  await timedChat(engine, 'Say hello.', 8, false);
  /** A run without its token ids, which only the comparison of the pair needs. */
  const kept = (/** @type {Awaited<ReturnType<typeof timedChat>>} */ { token_ids, ...run }) => run;
  const results = [];
  for (const [workload, texts] of Object.entries(workloads)) {
    const pairs = [];
    for (const [p, text] of texts.entries()) {
      for (let r = 0; r < repeats; r += 1) {
        const lookupFirst = (p + r) % 2 === 1;
        const first = await timedChat(engine, text, maxTokens, lookupFirst);
        const second = await timedChat(engine, text, maxTokens, !lookupFirst);
        const [lookup, plain] = lookupFirst ? [first, second] : [second, first];
        const sameTokens = lookup.token_ids.length === plain.token_ids.length && lookup.token_ids.every((t, i) => t === plain.token_ids[i]);
        pairs.push({ prompt: p, repeat: r, lookup_first: lookupFirst, plain: kept(plain), lookup: kept(lookup), same_text: lookup.text === plain.text, same_tokens: sameTokens });
        const rate = (/** @type {number | null} */ v) => (v == null ? '–' : v.toFixed(2));
        console.log(`${workload} prompt ${p} pair ${r}: plain ${rate(plain.decode_tok_s)} tok/s, lookup ${rate(lookup.decode_tok_s)} tok/s, ${lookup.tokens} tokens, ${JSON.stringify(lookup.speculative)}`);
      }
    }
    results.push({ workload, prompts: texts.length, pairs });
  }
  await engine.unload();
  return { backend, cpu, speculative, max_tokens: maxTokens, repeats, workloads: results };
}

/**
 * An embedding model's sentences per second in the page: `inputs` (token-id arrays, the native
 * bench's) embedded in one call, an untimed call and then `repeats` timed ones.
 * @param {{ modelUrl: string, inputs: number[][], repeats: number }} options
 */
export async function runKestrelEmbeddings({ modelUrl, inputs, repeats }) {
  const engine = await createEngine({ model: modelUrl, backend: 'cpu' });
  /** @type {number[]} */
  const rates = [];
  await engine.embeddings.create({ input: inputs });
  for (let r = 0; r < repeats; r += 1) {
    const start = performance.now();
    const answer = await engine.embeddings.create({ input: inputs });
    if (answer.data.length !== inputs.length) throw new Error(`${answer.data.length} vectors for ${inputs.length} inputs`);
    rates.push(inputs.length / ((performance.now() - start) / 1e3));
  }
  const info = engine.info;
  await engine.unload();
  return { backend: info.backend, cpu: info.cpu, inputs: inputs.length, tokens_per_input: inputs[0]?.length ?? 0, sentences_per_s: rates };
}

/** The adapter's name and features as this page sees them (null without WebGPU). */
export async function adapterInfo() {
  const adapter = await navigator.gpu?.requestAdapter();
  if (!adapter) return null;
  const info = adapter.info ?? {};
  return { vendor: info.vendor, architecture: info.architecture, device: info.device, description: info.description, features: [...adapter.features].sort() };
}

/**
 * wllama on CPU threads (`gpuLayers` 0) or on llama.cpp's WebGPU backend (every layer). Its
 * WebGPU backend needs shader-f16: without it the run is reported as cannot-run, with why.
 * @param {Workload & { modelUrl: string, threads: number, gpuLayers: number, contextLength: number }} options
 */
export async function runWllama({ modelUrl, prompts, decodeTokens, repeats, threads, gpuLayers, contextLength }) {
  const backend = gpuLayers > 0 ? 'webgpu' : 'cpu';
  if (backend === 'webgpu') {
    const adapter = await adapterInfo();
    if (!adapter) return { engine: 'wllama', backend, cannot_run: 'no WebGPU adapter' };
    if (!adapter.features.includes('shader-f16')) {
      return { engine: 'wllama', backend, cannot_run: `the adapter (${adapter.description || adapter.vendor || 'unknown'}) lacks shader-f16, which llama.cpp's WebGPU backend needs` };
    }
  }
  // The vendored module has no types here: its constructor as Wllama (above) describes it.
  const { Wllama } = /** @type {{ Wllama: new (paths: { default: string }, config: { suppressNativeLog: boolean }) => Wllama }} */ (await import(WLLAMA_URL));
  const wllama = new Wllama({ default: WLLAMA_WASM }, { suppressNativeLog: true });
  const t = performance.now();
  await wllama.loadModelFromUrl(new URL(modelUrl, location.href).href, {
    n_ctx: contextLength, n_threads: threads, n_gpu_layers: gpuLayers, useCache: false,
  });
  const loadMs = performance.now() - t;
  /** @type {Generate} */
  const generate = async (text, maxTokens, onToken) => {
    /** @type {{ cache_n: number, prompt_n: number } | null} */
    let timings = null;
    const stream = await wllama.createCompletion({
      prompt: text, stream: true, max_tokens: maxTokens, temp: 0, temperature: 0, top_k: 1, ignore_eos: true,
      cache_prompt: false,
    });
    for await (const chunk of stream) {
      // One chunk per sampled token, as llama-server streams them; the closing chunk carries
      // the timings (and no new token).
      if (chunk.timings) timings = chunk.timings;
      else if (chunk.choices?.length) onToken();
    }
    if (!timings) throw new Error('wllama reported no timings');
    if (timings.cache_n > 0) throw new Error(`wllama reused ${timings.cache_n} cached prompt tokens`);
    return { prompt_tokens: timings.prompt_n };
  };
  const result = await runWorkload({ prompts, decodeTokens, repeats }, generate);
  const memory = await measureMemory();
  const wasmHeap = await wasmHeapBytes();
  const multithread = wllama.isMultithread();
  const usedThreads = wllama.getNumThreads();
  await wllama.exit();
  return { engine: 'wllama', backend, multithread, threads: usedThreads, cold_load_ms: loadMs, memory, wasm_heap_bytes: wasmHeap, ...result };
}
