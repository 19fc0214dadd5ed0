// Kestrel's browser package: an OpenAI-style API over the wasm engine, which runs in a module
// Web Worker (worker.js) so the page's main thread never waits on it.

// Typed by index.d.ts (the package's declared API), checked with `tsc --checkJs` (www/tsconfig.json).
/**
 * @import {
 *   ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Completion, CompletionRequest, CreateEngineOptions,
 *   Engine as EngineApi, EngineInfo, EngineMemory, EngineStatus, Estimate, FinishReason, KestrelDetails, KestrelErrorCode, LoadProgress, Timings, Usage,
 * } from './index.d.ts'
 * @import { GenerateResult } from './remote.js'
 */

import { isKestrelError, KestrelError, kestrelError } from './errors.js';
import { RemoteBackend } from './remote.js';

export { isKestrelError, KestrelError };
import { PREFIX_DIRECTORY } from './storage.js';

/**
 * A message from the worker (worker.js).
 * @typedef {({ id: number } & (
 *   | { type: 'progress', progress: LoadProgress }
 *   | { type: 'token', text: string, tokenId?: number }
 *   | { type: 'result', value: any }
 *   | { type: 'error', error: { code: string, message: string } }
 * )) | { type: 'status', id?: undefined, status: EngineStatus['status'], info?: EngineInfo, error?: { code: string, message: string } }} WorkerMessage
 */

/**
 * Handlers of one pending request.
 * @typedef {{
 *   onStart?: (id: number) => void,
 *   onProgress?: ((progress: LoadProgress) => void) | null,
 *   onToken?: ((text: string, tokenId: number | undefined) => void) | null,
 * }} Handlers
 */

const CACHE_NAME = 'kestrel-models';

/**
 * Whether the Cache API holds the model at `url` (stored by an earlier load).
 * @param {string} url
 * @returns {Promise<boolean>}
 */
export async function hasModelInCache(url) {
  if (!globalThis.caches) return false;
  const cache = await caches.open(CACHE_NAME);
  return Boolean(await cache.match(new URL(url, location.href).href));
}

/**
 * The models the Cache API holds (stored by earlier loads), with their sizes in bytes.
 * @returns {Promise<{ url: string, bytes: number }[]>}
 */
export async function listCachedModels() {
  if (!globalThis.caches) return [];
  const cache = await caches.open(CACHE_NAME);
  const models = [];
  for (const request of await cache.keys()) {
    const response = await cache.match(request);
    if (!response) continue;
    const length = Number(response.headers.get('content-length'));
    models.push({ url: request.url, bytes: length || (await response.blob()).size });
  }
  return models;
}

/**
 * Removes the model at `url` from the Cache API; true when there was one.
 * @param {string} url
 * @returns {Promise<boolean>}
 */
export async function deleteModelFromCache(url) {
  if (!globalThis.caches) return false;
  const cache = await caches.open(CACHE_NAME);
  return cache.delete(new URL(url, location.href).href);
}

/**
 * The `worker_error` of the engine's worker's `error` event. The dev servers of Vite 5-7 pre-bundle
 * this file into node_modules/.vite/deps/, where `new URL('./worker.js', import.meta.url)` names no
 * file, so the worker cannot start there: the message then says the fix.
 * @param {ErrorEvent} e
 */
function workerError(e) {
  const why = e.message || 'could not start it';
  const fix = !e.message && import.meta.url.includes('/.vite/deps/')
    ? " (Vite's dev server pre-bundled @kestrel-llm/web away from its worker: add optimizeDeps: { exclude: ['@kestrel-llm/web'] } to vite.config)"
    : '';
  return kestrelError('worker_error', `the engine's worker failed: ${why}${fix}`);
}

/**
 * Deletes every KV prefix `persistPrefix` saved in this origin's storage (of every model); true
 * when there were any. Engines alive through it go on saving, into a new, empty store.
 * @returns {Promise<boolean>}
 */
export async function clearSavedPrefixes() {
  if (!globalThis.navigator?.storage?.getDirectory) return false;
  const root = await navigator.storage.getDirectory();
  return root.removeEntry(PREFIX_DIRECTORY, { recursive: true }).then(() => true, (e) => {
    if (e?.name === 'NotFoundError') return false;
    throw e;
  });
}

/**
 * Whether `model` (a URL, a File or a Blob) fits this browser with `slots` KV caches (default 1,
 * as `createEngine`'s option) of `context_length` tokens (of `kv_cache` values: 'f16', the
 * default, or 'f32'), from its GGUF header alone (an HTTP range request; no weight is fetched):
 * weight, KV cache and activation bytes and their total, the largest single buffer, unsupported
 * tensors. `fits` is the GPU's verdict: every buffer within the adapter's limits, and the total
 * within what the GPU can plausibly hold (`memory_limit`: WebGPU reports no memory size, so the
 * host memory `navigator.deviceMemory` reports where it is under 8 GiB, else 16 GiB). `cpu` is the
 * CPU backend's: the wasm memory it needs against 32-bit wasm's 4 GiB. Where a verdict is no,
 * `code` says why (`device_limits`, `unsupported_quant`, `no_webgpu`) and `reason` names the
 * numbers that decided it. `createEngine` makes the same checks before a download.
 * @param {{ model: string | URL | Blob, context_length?: number, kv_cache?: 'f16' | 'f32', slots?: number }} options
 * @returns {Promise<Estimate>}
 */
export async function estimate(options) {
  const { model, context_length, kv_cache, slots } = options ?? {};
  if (!(typeof model === 'string' || model instanceof URL || model instanceof Blob)) {
    throw kestrelError('invalid_option', 'invalid option model: expected a URL, a File or a Blob');
  }
  const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  try {
    return await new Promise((resolve, reject) => {
      worker.onmessage = ({ data }) => {
        if (data.type === 'result') resolve(data.value);
        else if (data.type === 'error') reject(kestrelError(/** @type {KestrelErrorCode} */ (data.error.code), data.error.message));
      };
      worker.onerror = (e) => reject(workerError(e));
      const url = model instanceof URL ? model.href : typeof model === 'string' ? new URL(model, location.href).href : model;
      worker.postMessage({ type: 'estimate', id: 0, model: url, context_length, kv_cache, slots });
    });
  } finally {
    worker.terminate();
  }
}

/**
 * A queue of values consumed with `for await`; `onCancel` runs when the consumer stops early.
 * @template T
 * @param {() => void} [onCancel]
 */
function channel(onCancel) {
  /** @type {T[]} */
  const items = [];
  /** @type {(() => void) | null} */
  let wake = null;
  let done = false;
  /** @type {unknown} */
  let failure = null;
  const notify = () => {
    if (wake) wake();
    wake = null;
  };
  return {
    /** @param {T} v */
    push(v) { items.push(v); notify(); },
    end() { done = true; notify(); },
    /** @param {unknown} e */
    fail(e) { failure = e; done = true; notify(); },
    /** @returns {AsyncGenerator<T, void, undefined>} */
    async *[Symbol.asyncIterator]() {
      try {
        for (;;) {
          if (items.length) yield /** @type {T} */ (items.shift());
          else if (failure) throw failure;
          else if (done) return;
          else await new Promise((r) => (wake = () => r(undefined)));
        }
      } finally {
        if (!done) onCancel?.();
      }
    },
  };
}

/** The request fields passed on to the engine as they are (`logprobs` is mapped). */
/** @type {(keyof import('./index.d.ts').SamplingOptions)[]} */
const SAMPLING_KEYS = [
  'max_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'seed', 'stop', 'stop_token_ids',
  'logit_bias', 'repetition_penalty', 'frequency_penalty', 'presence_penalty', 'penalty_last_n',
  'ignore_eos',
];

/**
 * @param {GenerateResult} r
 * @returns {Usage}
 */
function usageOf(r) {
  const t = r.timings;
  const completion = r.completion_tokens ?? r.token_ids.length;
  return {
    prompt_tokens: t.prompt_tokens,
    completion_tokens: completion,
    total_tokens: t.prompt_tokens + completion,
    extra: {
      prefill_tokens: t.prefill_tokens,
      reused_tokens: t.reused_tokens,
      prefill_tokens_per_s: t.prefill_tok_s,
      decode_tokens_per_s: t.decode_tok_s,
      time_to_first_token_s: t.ttft_ms / 1e3,
      time_per_output_token_s: t.decode_tokens > 0 ? t.decode_ms / 1e3 / t.decode_tokens : 0,
      host_wait_per_output_token_s: t.host_wait_ms_per_token / 1e3,
      prefill_submissions: t.prefill_submissions ?? null,
      longest_prefill_submission_s: t.longest_prefill_submission_ms == null ? null : t.longest_prefill_submission_ms / 1e3,
      e2e_latency_s: t.e2e_ms / 1e3,
    },
  };
}

/**
 * Where an engine's generations run: the worker (local) or an OpenAI-compatible server (remote).
 * @typedef {{
 *   generate: (body: Record<string, unknown>, handlers: Handlers) => Promise<GenerateResult>,
 *   abort: (id: number) => void,
 * }} Backend
 */

/**
 * One OpenAI-style request on `backend`: its chunks as an async iterable when streamed, else the
 * whole completion. Local and remote engines answer in the same shapes through this.
 * @param {'chat' | 'text'} kind
 * @param {Partial<ChatCompletionRequest & CompletionRequest>} request
 * @param {Backend} backend
 * @param {string} model
 * @returns {Promise<AsyncIterable<ChatCompletionChunk | Completion> | ChatCompletion | Completion>}
 */
function openaiRequest(kind, request, backend, model) {
  const { messages, prompt, stream = false, signal, logprobs, top_logprobs } = request ?? {};
  /** @type {Record<string, unknown>} */
  const body = {};
  for (const k of SAMPLING_KEYS) if (request?.[k] != null) body[k] = request[k];
  if (kind === 'chat') body.messages = messages;
  else body.prompt = prompt;
  if (logprobs) body.logprobs = top_logprobs ?? 1;
  const created = Math.floor(Date.now() / 1000);
  /** @type {number | null} */
  let requestId = null;
  let cancelled = false;
  // Leaving a `for await` early (break, throw) aborts the generation like the signal does.
  /** @type {ReturnType<typeof channel<ChatCompletionChunk | Completion>>} */
  const out = channel(() => {
    cancelled = true;
    onAbort();
  });
  /**
   * @param {string | null} text
   * @param {{ finish_reason: FinishReason | null, token_id?: number | null }} extra
   */
  const choice = (text, extra) =>
    kind === 'chat' ? { index: 0, delta: text === null ? {} : { role: 'assistant', content: text }, logprobs: null, ...extra }
      : { index: 0, text: text ?? '', logprobs: null, ...extra };
  /**
   * @param {any[]} choices
   * @param {{ usage?: Usage, kestrel?: KestrelDetails }} [more]
   * @returns {ChatCompletionChunk | Completion}
   */
  const chunk = (choices, more) => ({ id: `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestId}`, object: kind === 'chat' ? 'chat.completion.chunk' : 'text_completion', created, model, choices, ...more });

  function onAbort() {
    if (requestId !== null) backend.abort(requestId);
  }
  signal?.addEventListener('abort', onAbort, { once: true });
  const result = backend.generate(body, {
    onStart: (id) => {
      requestId = id;
      // Aborted before it was sent (or while queued): the abort goes out before the request
      // itself (onStart runs first), so a stepped engine ends it with no token, and the GPU's
      // single-sequence path at its first.
      if (signal?.aborted || cancelled) onAbort();
    },
    onToken: stream ? (/** @type {string} */ text, /** @type {number | undefined} */ tokenId) => out.push(chunk([choice(text, { finish_reason: null, token_id: tokenId ?? null })])) : null,
  }).finally(() => signal?.removeEventListener('abort', onAbort));

  /**
   * @param {GenerateResult} r
   * @returns {{ usage: Usage, kestrel: KestrelDetails }}
   */
  const final = (r) => {
    /** @type {KestrelDetails} */
    const kestrel = { prompt_token_ids: r.prompt_token_ids, token_ids: r.token_ids, timings: r.timings, logprobs: r.logprobs };
    return { usage: usageOf(r), kestrel };
  };
  if (stream) {
    result.then(
      (r) => {
        out.push(chunk([choice(null, { finish_reason: r.finish_reason })], final(r)));
        out.end();
      },
      (e) => out.fail(e),
    );
    return Promise.resolve(out);
  }
  return result.then((/** @type {GenerateResult} */ r) => {
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestId}`;
    /** @type {ChatCompletion | Completion} */
    const completion = kind === 'chat'
      ? { id, object: 'chat.completion', created, model, choices: [{ index: 0, message: { role: 'assistant', content: r.text }, finish_reason: r.finish_reason, logprobs: null }], ...final(r) }
      : { id, object: 'text_completion', created, model, choices: [{ index: 0, text: r.text, finish_reason: r.finish_reason, logprobs: null }], ...final(r) };
    return completion;
  });
}

/** @implements {EngineApi} */
class Engine {
  /** @type {Worker} */
  #worker;
  #nextId = 1;
  /** @type {Map<number, Handlers & { resolve: (value: any) => void, reject: (error: unknown) => void }>} */
  #pending = new Map();
  /** @type {Promise<unknown>} */
  #queue = Promise.resolve();
  /** @type {KestrelError | null} */
  #closed = null;
  /**
   * `{gpu: {adapter, backend, driver, features, limits}, model: {...}, version}` once loaded.
   * @type {EngineInfo}
   */
  info = /** @type {EngineInfo} */ (/** @type {unknown} */ (null));

  /** @type {CreateEngineOptions['onStatus']} */
  #onStatus;

  /**
   * @param {Worker} worker
   * @param {CreateEngineOptions['onStatus']} onStatus
   */
  constructor(worker, onStatus) {
    this.#worker = worker;
    this.#onStatus = onStatus;
    worker.onmessage = ({ data }) => this.#onMessage(data);
    worker.onerror = (e) => this.#fail(workerError(e));
    /** @type {EngineApi['chat']} */
    this.chat = { completions: { create: /** @type {any} */ ((/** @type {ChatCompletionRequest} */ request) => this.#create('chat', request)) } };
    /** @type {EngineApi['completions']} */
    this.completions = { create: /** @type {any} */ ((/** @type {CompletionRequest} */ request) => this.#create('text', request)) };
  }

  /** @param {WorkerMessage} msg */
  #onMessage(msg) {
    if (msg.type === 'status') {
      // The worker recovering from a device loss by itself.
      if (msg.status === 'ready' && msg.info) this.info = { ...msg.info, backend: 'webgpu' };
      this.#onStatus?.(msg.error ? { status: msg.status, error: msg.error } : { status: msg.status });
      return;
    }
    const p = this.#pending.get(msg.id);
    if (!p) return;
    if (msg.type === 'progress') p.onProgress?.(msg.progress);
    else if (msg.type === 'token') p.onToken?.(msg.text, msg.tokenId);
    else {
      this.#pending.delete(msg.id);
      if (msg.type === 'result') p.resolve(msg.value);
      else p.reject(kestrelError(/** @type {KestrelErrorCode} */ (msg.error.code), msg.error.message));
    }
  }

  /** @param {KestrelError} error */
  #fail(error) {
    this.#closed ??= error;
    for (const p of this.#pending.values()) p.reject(error);
    this.#pending.clear();
  }

  /**
   * Sends one message and waits for its answer; requests run one at a time, in order.
   * @param {{ type: string, [key: string]: unknown }} msg
   * @param {Handlers} [handlers]
   * @param {Transferable[]} [transfer]
   * @returns {Promise<any>}
   */
  #call(msg, handlers = {}, transfer) {
    const result = this.#queue.then(() => this.#send(msg, handlers, transfer), () => this.#send(msg, handlers, transfer));
    this.#queue = result.catch(() => {});
    return result;
  }

  /**
   * Sends one message after the queued ones have started, without holding back the ones after
   * it: generations on an engine with several slots, which the worker runs as one batch.
   * @param {{ type: string, [key: string]: unknown }} msg
   * @param {Handlers} [handlers]
   * @returns {Promise<any>}
   */
  #callBeside(msg, handlers = {}) {
    const send = () => this.#send(msg, handlers);
    return this.#queue.then(send, send);
  }

  /**
   * @param {{ type: string, [key: string]: unknown }} msg
   * @param {Handlers} handlers
   * @param {Transferable[]} [transfer]
   * @returns {Promise<any>}
   */
  #send(msg, handlers, transfer) {
    if (this.#closed) return Promise.reject(this.#closed);
    const id = this.#nextId++;
    handlers.onStart?.(id);
    return new Promise((/** @type {(value: any) => void} */ resolve, reject) => {
      this.#pending.set(id, { resolve, reject, ...handlers });
      this.#worker.postMessage({ ...msg, id }, transfer ?? []);
    });
  }

  /**
   * @param {string | Blob} model
   * @param {CreateEngineOptions['onProgress']} onProgress
   * @param {CreateEngineOptions['gpu'] & { backend?: 'webgpu' | 'cpu' | 'auto', context_length?: number, kv_cache?: 'f16' | 'f32', slots?: number, submit_budget_ms?: number }} gpu
   * @param {string | undefined} sha256
   * @param {{ maxBytes: number } | null} persist `persistPrefix`
   */
  async _load(model, onProgress, gpu, sha256, persist) {
    this.info = await this.#call({ type: 'load', model, gpu, sha256, persist }, { onProgress });
    return this.info;
  }

  /**
   * @param {'chat' | 'text'} kind
   * @param {Partial<ChatCompletionRequest & CompletionRequest>} request
   */
  #create(kind, request) {
    const worker = this.#worker;
    /** @type {Backend} */
    const backend = {
      // With several slots (the `slots` option), concurrent requests run as one batch.
      generate: (body, handlers) => ((this.info?.model?.slots ?? 1) > 1 ? this.#callBeside : this.#call).call(this, { type: 'generate', request: body }, handlers),
      abort: (id) => worker.postMessage({ type: 'abort', id }),
    };
    return openaiRequest(kind, request, backend, this.info?.model?.name ?? 'kestrel');
  }

  /**
   * Test hook: destroys the worker's GPU device at once (not queued behind requests), as a driver
   * reset would lose it. The request in flight fails with `device_lost`; the engine recovers.
   */
  _destroyDevice() {
    this.#worker.postMessage({ type: 'destroy-device', id: 0 });
  }

  /**
   * Forgets the conversation cached on the GPU: the next request prefills from scratch, unless
   * `persistPrefix` saved a matching prefix (`clearSavedPrefixes()` deletes those).
   */
  reset() {
    return this.#call({ type: 'reset' });
  }

  /**
   * What the engine's worker holds now: its wasm memory and its live GPU buffers.
   * @returns {Promise<EngineMemory>}
   */
  memory() {
    return this.#call({ type: 'memory' });
  }

  /**
   * Resolves once the work after the requests queued before it has ended: with `persistPrefix`,
   * the last request's KV prefix written to storage (it is saved after the answer).
   * @returns {Promise<void>}
   */
  flush() {
    return this.#call({ type: 'flush' });
  }

  /** Drops the model (freeing its GPU memory) and stops the worker; the engine is unusable after. */
  async unload() {
    if (this.#closed) return;
    await this.#call({ type: 'unload' }).catch(() => {});
    this.#worker.terminate();
    this.#fail(kestrelError('unloaded', 'the engine was unloaded'));
  }
}

/**
 * Checks a remote engine's requests with the local engines' own code (the wasm engine's
 * `validateRequest`, in a worker of its own started at the first request), so that a mistake
 * fails here with their codes instead of reaching the server.
 */
class RequestValidator {
  /** @type {Worker | null} */
  #worker = null;
  #nextId = 1;
  /** @type {Map<number, { resolve: (value: unknown) => void, reject: (error: unknown) => void }>} */
  #pending = new Map();

  /**
   * Resolves when `body` (the worker's request body) is one a local engine accepts; rejects with
   * its error otherwise.
   * @param {Record<string, unknown>} body
   * @returns {Promise<unknown>}
   */
  check(body) {
    const worker = this.#worker ?? this.#start();
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      worker.postMessage({ type: 'validate', id, request: body });
    });
  }

  #start() {
    const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
    worker.onmessage = ({ data }) => {
      const p = this.#pending.get(data.id);
      if (!p || (data.type !== 'result' && data.type !== 'error')) return;
      this.#pending.delete(data.id);
      if (data.type === 'result') p.resolve(undefined);
      else p.reject(kestrelError(/** @type {KestrelErrorCode} */ (data.error.code), data.error.message));
    };
    worker.onerror = (e) => {
      for (const p of this.#pending.values()) p.reject(workerError(e));
      this.#pending.clear();
      this.close();
    };
    this.#worker = worker;
    return worker;
  }

  close() {
    this.#worker?.terminate();
    this.#worker = null;
  }
}

/**
 * An engine whose requests go to an OpenAI-compatible server (createEngine's `remote`), chosen
 * when this browser cannot run the model. Same API, and the same checks of a request before it
 * is sent; nothing is held locally.
 * @implements {EngineApi}
 */
class RemoteEngine {
  /** @type {RemoteBackend} */
  #backend;
  #validator = new RequestValidator();
  #closed = false;

  /**
   * @param {RemoteBackend} backend
   * @param {KestrelError} reason why the model does not run here
   */
  constructor(backend, reason) {
    this.#backend = backend;
    /** @type {EngineInfo} */
    this.info = {
      backend: 'remote', fallback: { code: reason.code, message: reason.message },
      remote: { baseURL: backend.baseURL, model: backend.model }, gpu: null, model: null, version: null,
    };
    /** @type {EngineApi['chat']} */
    this.chat = { completions: { create: /** @type {any} */ ((/** @type {ChatCompletionRequest} */ request) => this.#create('chat', request)) } };
    /** @type {EngineApi['completions']} */
    this.completions = { create: /** @type {any} */ ((/** @type {CompletionRequest} */ request) => this.#create('text', request)) };
  }

  /**
   * @param {'chat' | 'text'} kind
   * @param {Partial<ChatCompletionRequest & CompletionRequest>} request
   */
  #create(kind, request) {
    if (this.#closed) return Promise.reject(kestrelError('unloaded', 'the engine was unloaded'));
    const remote = this.#backend;
    /** @type {Backend} */
    const backend = {
      generate: async (body, handlers) => {
        await this.#validator.check(body);
        return remote.generate(body, handlers);
      },
      abort: (id) => remote.abort(id),
    };
    return openaiRequest(kind, request, backend, remote.model);
  }

  /** The server keeps its own cache: nothing to forget here. */
  async reset() {}

  /** Nothing is saved here. */
  async flush() {}

  /** @returns {Promise<EngineMemory>} */
  async memory() {
    return { wasm_bytes: 0, gpu_buffers: 0, gpu_buffer_bytes: 0 };
  }

  /** Aborts the requests in flight; the engine is unusable after. */
  async unload() {
    this.#closed = true;
    this.#backend.abortAll();
    this.#validator.close();
  }
}

/** The default bound of the KV prefixes `persistPrefix` keeps, every model's together. */
const PERSIST_MAX_BYTES = 256 * 2 ** 20;

/**
 * `persistPrefix` as the worker takes it: null when off.
 * @param {CreateEngineOptions['persistPrefix']} option
 * @returns {{ maxBytes: number } | null}
 */
function persistOption(option) {
  if (option == null || option === false) return null;
  if (option === true) return { maxBytes: PERSIST_MAX_BYTES };
  const maxBytes = typeof option === 'object' ? option.maxBytes ?? PERSIST_MAX_BYTES : NaN;
  if (!(Number.isSafeInteger(maxBytes) && maxBytes > 0)) {
    throw kestrelError('invalid_option', 'invalid option persistPrefix: expected true, false or { maxBytes: a positive integer }');
  }
  return { maxBytes };
}

/** Errors that mean this browser cannot run the model, where `remote` takes over. */
const FALL_THROUGH = new Set(['no_webgpu', 'device_limits', 'out_of_memory']);

/**
 * Starts a worker, creates the GPU device in it (or not: `backend`) and loads `model` (a URL, a
 * File or a Blob). `backend`: 'webgpu', 'cpu' (wasm SIMD kernels in the worker) or 'auto' (the
 * default): the GPU unless there is no WebGPU, its adapter is a software rasterizer, or the
 * model does not fit it; `engine.info.backend` and `backend_reason` say which and why.
 * Resolves once the model is ready. `onProgress({phase, loaded, total})` follows the load:
 * phase 'download' | 'cache' | 'upload' (a local File/Blob) | 'compile' | 'ready'.
 * `gpu: {allow_f16, allow_subgroups, allow_timestamps}` forces optional GPU features off;
 * `context_length` sizes the KV cache (default: the model's context, at most 4096), and
 * `kv_cache` sets how it stores keys and values ('f16', the default, or 'f32').
 * `slots` (1 to 16, default 1): how many requests run at once as one batch, each with its own
 * KV cache of context_length tokens; concurrent `create()` calls then share each pass of the
 * model instead of waiting in turn. `engine.info.model.slots` says how many run.
 * `submit_budget_ms`: the GPU time one submission of a prompt may take, so that the browser,
 * whose GPU process also draws the page, draws frames between them (default: half the display's
 * frame interval, measured as the worker starts; 0: a whole prompt chunk at once, a little faster
 * where nothing else is drawn). `engine.info.model.submit_budget_ms` says what runs;
 * `usage.extra.longest_prefill_submission_s` what the longest took.
 * `onStatus({status})` follows the engine recovering by itself from a lost GPU device: the
 * request in flight fails with `device_lost`, then 'device_lost', 'reloading' (the model from the
 * Cache API or the same File), 'ready' (or 'failed' with `error`); later requests wait for it.
 * `sha256` (hex): the file's digest, checked as it streams; a mismatch is `bad_model` and the
 * copy is not kept in the Cache API. `info.model_cache` says whether the Cache API kept the file
 * (not where the storage quota has no room: `quota_exceeded`).
 * `persistPrefix` (`true` or `{maxBytes}`): the conversation's KV rows are saved in the Origin
 * Private File System after each request, so a request after a page reload prefills only what
 * follows the saved tokens.
 * Before downloading a URL it checks from the header that the model fits (`estimate`), failing
 * with `device_limits` or `unsupported_quant` without fetching the weights.
 * `remote: {baseURL, apiKey, model}`: where the model cannot run here (`no_webgpu`,
 * `device_limits`, `out_of_memory`; with backend 'auto' only what the CPU path cannot run either),
 * the engine sends the same requests to that OpenAI-compatible server instead
 * (`engine.info.backend` is then 'remote').
 * @param {CreateEngineOptions} options
 * @returns {Promise<EngineApi>}
 */
export async function createEngine(options) {
  const { model, onProgress, onStatus, backend = 'auto', gpu, context_length, kv_cache, slots, submit_budget_ms, remote, sha256, persistPrefix } = options ?? {};
  if (!['webgpu', 'cpu', 'auto'].includes(backend)) {
    throw kestrelError('invalid_option', "invalid option backend: expected 'webgpu', 'cpu' or 'auto'");
  }
  if (!(typeof model === 'string' || model instanceof URL || model instanceof Blob)) {
    throw kestrelError('invalid_option', 'invalid option model: expected a URL, a File or a Blob');
  }
  if (sha256 != null && !/^[0-9a-fA-F]{64}$/.test(sha256)) {
    throw kestrelError('invalid_option', 'invalid option sha256: expected 64 hexadecimal digits');
  }
  const persist = persistOption(persistPrefix);
  const remoteBackend = remote == null ? null : new RemoteBackend(remote);
  if (backend === 'webgpu' && !globalThis.navigator?.gpu) {
    const error = kestrelError('no_webgpu', 'WebGPU is not available in this browser (navigator.gpu is missing)');
    if (remoteBackend) return new RemoteEngine(remoteBackend, error);
    throw error;
  }
  const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  const engine = new Engine(worker, onStatus);
  try {
    await engine._load(model instanceof URL ? model.href : typeof model === 'string' ? new URL(model, location.href).href : model, onProgress, { ...gpu, backend, context_length, kv_cache, slots, submit_budget_ms }, sha256, persist);
  } catch (e) {
    worker.terminate();
    const code = /** @type {KestrelError} */ (e)?.code;
    if (remoteBackend && FALL_THROUGH.has(code)) return new RemoteEngine(remoteBackend, /** @type {KestrelError} */ (e));
    throw e;
  }
  return engine;
}
