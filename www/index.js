// Kestrel's browser package: an OpenAI-style API over the wasm engine, which runs in a module
// Web Worker (worker.js) so the page's main thread never waits on it.

// Typed by index.d.ts (the package's declared API), checked with `tsc --checkJs` (www/tsconfig.json).
/**
 * @import {
 *   ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Completion, CompletionRequest, CreateEmbeddingResponse,
 *   CreateEngineOptions, EmbeddingCreateParams, Engine as EngineApi, EngineInfo, EngineMemory, Estimate, KestrelErrorCode, LoadProgress, RemoteOptions,
 *   RerankParams, RerankResponse,
 * } from './index.d.ts'
 */

import { isKestrelError, KestrelError, kestrelError } from './errors.js';

export { isKestrelError, KestrelError };
import { CACHE_NAME, PREFIX_DIRECTORY, SHARD_HEADER } from './storage.js';
import { SharedEngineConnection } from './shared.js';

/**
 * What the engine talks to: its own Worker, or its connection to the shared engine (shared.js).
 * @typedef {Worker | SharedEngineConnection} EngineWorker
 */

/**
 * @import { ConnectRequest, LoadRequest, Reply, EngineRequest, RequestBody } from './protocol.d.ts'
 */

/**
 * Handlers of one pending request.
 * @typedef {{
 *   onStart?: (id: number) => void,
 *   onProgress?: ((progress: LoadProgress) => void) | null,
 *   onChunk?: ((chunk: any) => void) | null,
 * }} Handlers
 */

/**
 * The Cache API's models: each a URL (a split model's first shard's) with its responses (the
 * file's, or every cached shard's) and how many shards it has.
 * @param {Cache} cache
 * @returns {Promise<Map<string, { requests: Request[], responses: Response[], shards: number }>>}
 */
async function cachedModels(cache) {
  const models = new Map();
  for (const request of await cache.keys()) {
    const response = await cache.match(request);
    if (!response) continue;
    const [, count, first] = /^\d+\/(\d+) (.+)$/.exec(response.headers.get(SHARD_HEADER) ?? '') ?? [];
    const url = first ?? request.url;
    const model = models.get(url) ?? { requests: [], responses: [], shards: Number(count) || 1 };
    model.requests.push(request);
    model.responses.push(response);
    models.set(url, model);
  }
  return models;
}

/**
 * Whether the Cache API holds the model at `url` (stored by an earlier load): a split model's
 * (`url` its first shard's) with every shard.
 * @param {string} url
 * @returns {Promise<boolean>}
 */
export async function hasModelInCache(url) {
  if (!globalThis.caches) return false;
  const model = (await cachedModels(await caches.open(CACHE_NAME))).get(new URL(url, location.href).href);
  return Boolean(model && model.responses.length === model.shards);
}

/**
 * The models the Cache API holds (stored by earlier loads), with their sizes in bytes: a split
 * model once, under its first shard's URL, with its cached shards' bytes.
 * @returns {Promise<{ url: string, bytes: number }[]>}
 */
export async function listCachedModels() {
  if (!globalThis.caches) return [];
  const models = [];
  for (const [url, { responses }] of await cachedModels(await caches.open(CACHE_NAME))) {
    let bytes = 0;
    for (const response of responses) bytes += Number(response.headers.get('content-length')) || (await response.blob()).size;
    models.push({ url, bytes });
  }
  return models;
}

/**
 * Removes the model at `url` (a split model's: every shard) from the Cache API; true when there
 * was one.
 * @param {string} url
 * @returns {Promise<boolean>}
 */
export async function deleteModelFromCache(url) {
  if (!globalThis.caches) return false;
  const cache = await caches.open(CACHE_NAME);
  const model = (await cachedModels(cache)).get(new URL(url, location.href).href);
  if (!model) return false;
  await Promise.all(model.requests.map((request) => cache.delete(request)));
  return true;
}

/**
 * The `model` option (or `name`'s, `draftModel`) as the worker takes it: a URL made absolute (a
 * split model's first shard's brings the other shards), a File or a Blob, or an array of a split
 * model's shards (Files or Blobs, a FileList too). Anything else is `invalid_option`.
 * @param {unknown} model
 * @param {string} [name]
 * @returns {string | Blob | Blob[]}
 */
function modelOption(model, name = 'model') {
  if (model instanceof URL) return model.href;
  if (typeof model === 'string') return new URL(model, location.href).href;
  if (model instanceof Blob) return model;
  const shards = globalThis.FileList && model instanceof FileList ? [...model] : model;
  if (Array.isArray(shards) && shards.length > 0 && shards.every((m) => m instanceof Blob)) return shards;
  throw kestrelError('invalid_option', `invalid option ${name}: expected a URL, a File or a Blob, or an array of a split model's shards (Files or Blobs)`);
}

/**
 * A new module worker hosting an engine (worker.js). Written out as bundlers look for it
 * (`new Worker(new URL(..., import.meta.url))`), so that they bundle the worker.
 */
function startWorker() {
  return new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
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
 * default, or 'f32'), with `draftModel` beside it on the CPU backend where given (`cpu.draft_bytes`;
 * only the CPU backend runs a draft model), from its GGUF header alone (an HTTP range request; no
 * weight is fetched):
 * weight, KV cache and activation bytes and their total, the largest single buffer, unsupported
 * tensors. `fits` is the GPU's verdict: every buffer within the adapter's limits, and the total
 * within what the GPU can plausibly hold (`memory_limit`: WebGPU reports no memory size, so the
 * host memory `navigator.deviceMemory` reports where it is under 8 GiB, else 16 GiB). `cpu` is the
 * CPU backend's: the wasm memory it needs against 32-bit wasm's 4 GiB. Where a verdict is no,
 * `code` says why (`device_limits`, `unsupported_quant`, `no_webgpu`) and `reason` names the
 * numbers that decided it. `createEngine` makes the same checks before a download.
 * @param {{ model: string | URL | Blob, context_length?: number, kv_cache?: 'f16' | 'f32', slots?: number, draftModel?: string | URL | Blob }} options
 * @returns {Promise<Estimate>}
 */
export async function estimate(options) {
  const { context_length, kv_cache, slots } = options ?? {};
  const model = modelOption(options?.model);
  const draftModel = options?.draftModel == null ? undefined : modelOption(options.draftModel, 'draftModel');
  const worker = startWorker();
  try {
    return await new Promise((resolve, reject) => {
      worker.onmessage = (/** @type {MessageEvent<Reply>} */ { data }) => {
        if (data.type === 'result') resolve(/** @type {Estimate} */ (data.value));
        // A crash may leave the call unanswered: its status says why.
        const error = data.type === 'error' || (data.type === 'status' && data.status === 'crashed') ? data.error : undefined;
        if (error) reject(kestrelError(/** @type {KestrelErrorCode} */ (error.code), error.message));
      };
      worker.onerror = (e) => reject(workerError(e));
      worker.postMessage(/** @satisfies {EngineRequest} */ ({ type: 'estimate', id: 0, model, context_length, kv_cache, slots, draftModel }));
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

/**
 * One OpenAI-style request (`endpoint` 'chat' or 'completions'), sent by `send` and aborted by
 * `abort`: its chunks as an async iterable when streamed, else the whole completion. The engine
 * core in the worker writes every chunk and completion, for local and remote engines alike; here
 * the request only travels, and its `signal` (or leaving a `for await` early) aborts it.
 * @param {'chat' | 'completions'} endpoint
 * @param {Partial<ChatCompletionRequest & CompletionRequest>} request
 * @param {(msg: RequestBody, handlers: Handlers) => Promise<any>} send
 * @param {(id: number) => void} abort
 * @returns {Promise<AsyncIterable<ChatCompletionChunk | Completion> | ChatCompletion | Completion>}
 */
function openaiRequest(endpoint, request, send, abort) {
  const { signal, ...body } = request ?? {};
  /** @type {number | null} */
  let requestId = null;
  let cancelled = false;
  // Leaving a `for await` early (break, throw) aborts the generation like the signal does.
  /** @type {ReturnType<typeof channel<ChatCompletionChunk | Completion>>} */
  const out = channel(() => {
    cancelled = true;
    onAbort();
  });
  function onAbort() {
    if (requestId !== null) abort(requestId);
  }
  signal?.addEventListener('abort', onAbort, { once: true });
  const result = send({ type: 'generate', endpoint, body }, {
    onStart: (id) => {
      requestId = id;
      // Aborted before it was sent (or while queued): the abort goes out before the request
      // itself (onStart runs first), so the engine ends it with no token.
      if (signal?.aborted || cancelled) onAbort();
    },
    onChunk: body.stream === true ? (chunk) => out.push(chunk) : null,
  }).finally(() => signal?.removeEventListener('abort', onAbort));
  if (body.stream === true) {
    result.then(() => out.end(), (e) => out.fail(e));
    return Promise.resolve(out);
  }
  return result;
}

/**
 * What an aborted call rejects with: the signal's reason, as `fetch` does.
 * @param {AbortSignal} signal
 */
function abortError(signal) {
  return signal.reason ?? new DOMException('This operation was aborted', 'AbortError');
}

/** @implements {EngineApi} */
class Engine {
  /** @type {EngineWorker} */
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

  /** The shared engine's clients as it last said (createEngine's `shared`). */
  #clients = { clients: 1, abandoned_requests: 0 };

  /**
   * The message that set the worker up ('load', or a remote engine's 'connect'), sent again to the
   * new worker that replaces one whose engine crashed.
   * @type {Omit<LoadRequest, 'id'> | Omit<ConnectRequest, 'id'> | null}
   */
  #setup = null;

  /**
   * The new worker's reload after a crash, which calls wait for; null otherwise.
   * @type {Promise<void> | null}
   */
  #restarting = null;

  /**
   * @param {EngineWorker} worker
   * @param {CreateEngineOptions['onStatus']} onStatus
   */
  constructor(worker, onStatus) {
    this.#worker = this.#listen(worker);
    this.#onStatus = onStatus;
    /** @type {EngineApi['chat']} */
    this.chat = { completions: { create: /** @type {any} */ ((/** @type {ChatCompletionRequest} */ request) => this.#create('chat', request)) } };
    /** @type {EngineApi['completions']} */
    this.completions = { create: /** @type {any} */ ((/** @type {CompletionRequest} */ request) => this.#create('completions', request)) };
    /** @type {EngineApi['embeddings']} */
    this.embeddings = { create: /** @type {any} */ ((/** @type {EmbeddingCreateParams} */ request) => this.#encode('embed', request)) };
  }

  /**
   * Takes `worker`'s messages and errors.
   * @param {EngineWorker} worker
   */
  #listen(worker) {
    worker.onmessage = (/** @type {{ data: Reply }} */ { data }) => this.#onMessage(data);
    worker.onerror = (/** @type {ErrorEvent} */ e) => this.#fail(workerError(e));
    return worker;
  }

  /** @param {Reply} msg */
  #onMessage(msg) {
    if (msg.type === 'clients') {
      this.#clients = { clients: msg.clients, abandoned_requests: msg.abandoned_requests };
      if (this.info) this.info = { ...this.info, shared: this.#sharedInfo() };
      return;
    }
    if (msg.type === 'lost') {
      // The shared engine's leading tab closed: what ran there is lost; the next tab took over and
      // reloads the model ('ready' or 'failed' follows, from the new leader's hub).
      const lost = kestrelError('leader_lost', 'the tab that ran the shared engine closed; another tab took it over: retry the request');
      for (const p of this.#pending.values()) p.reject(lost);
      this.#pending.clear();
      if (this.info) this.info = { ...this.info, shared: this.#sharedInfo() };
      this.#onStatus?.({ status: 'leader_lost' });
      this.#onStatus?.({ status: 'reloading' });
      return;
    }
    if (msg.type === 'status' && msg.status === 'crashed') {
      this.#crashed(/** @type {{ code: string, message: string }} */ (msg.error));
      return;
    }
    if (msg.type === 'status') {
      // The worker recovering from a device loss by itself, or a new leader's reload of the
      // shared engine: the info is the reloaded engine's.
      if (msg.status === 'ready' && msg.info) this.info = { ...msg.info, shared: this.#sharedInfo() };
      this.#onStatus?.(msg.error ? { status: msg.status, error: msg.error } : { status: msg.status });
      return;
    }
    const p = this.#pending.get(msg.id);
    if (!p) return;
    if (msg.type === 'progress') p.onProgress?.(msg.progress);
    else if (msg.type === 'token') p.onChunk?.(msg.chunk);
    else {
      this.#pending.delete(msg.id);
      if (msg.type === 'result') p.resolve(msg.value);
      else p.reject(new KestrelError(/** @type {KestrelErrorCode} */ (msg.error.code), msg.error.message, { remote: msg.error.remote }));
    }
  }

  /** `info.shared`: how this tab reaches the shared engine and how many tabs use it; null when not shared. */
  #sharedInfo() {
    const worker = this.#worker;
    return worker instanceof SharedEngineConnection ? { mode: worker.mode, ...this.#clients } : null;
  }

  /**
   * The worker's engine crashed (a trap of its wasm instance, whose state is then lost; see
   * engine-host.js): the calls in flight fail with the crash's `internal` error, and a new worker,
   * made as the first was, is set up again: the model reloaded from the Cache API (a URL's) or the
   * same File or Blob. Reported as 'crashed', 'reloading', then 'ready' or 'failed'; calls made
   * meanwhile wait for it. A crash during that reload fails it ('failed'), leaving a new worker
   * without a model, rather than reload again a model that may crash it each time.
   * @param {{ code: string, message: string }} error
   */
  #crashed(error) {
    const crash = kestrelError('internal', error.message);
    for (const p of this.#pending.values()) p.reject(crash);
    this.#pending.clear();
    // createEngine's own load crashed: it fails with the crash, and ends the worker.
    if (!this.#setup || this.#closed) return;
    const reloading = this.#restarting !== null;
    if (!reloading) this.#onStatus?.({ status: 'crashed', error });
    // A shared engine's connection has reached a new engine by itself (shared.js).
    if (!(this.#worker instanceof SharedEngineConnection)) this.#replaceWorker();
    if (!reloading) {
      this.#restarting = this.#restart(this.#setup).finally(() => {
        this.#restarting = null;
      });
    }
  }

  /** Ends the crashed worker and starts a new one, made as createEngine made it. */
  #replaceWorker() {
    const crashed = this.#worker;
    crashed.onmessage = null;
    crashed.onerror = null;
    crashed.terminate();
    this.#worker = this.#listen(startWorker());
  }

  /**
   * Sets the new worker up as the crashed one was (`setup`: its 'load' or 'connect'), reporting
   * 'reloading', then 'ready' or 'failed'.
   * @param {Omit<LoadRequest, 'id'> | Omit<ConnectRequest, 'id'>} setup
   */
  async #restart(setup) {
    this.#onStatus?.({ status: 'reloading' });
    try {
      const value = await this.#post(setup, {});
      if (setup.type === 'load') this.info = { ...value, shared: this.#sharedInfo() };
      this.#onStatus?.({ status: 'ready' });
    } catch (e) {
      const { code, message } = /** @type {KestrelError} */ (e);
      this.#onStatus?.({ status: 'failed', error: { code, message } });
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
   * @param {RequestBody} msg
   * @param {Handlers} [handlers]
   * @returns {Promise<any>}
   */
  #call(msg, handlers = {}) {
    const result = this.#queue.then(() => this.#send(msg, handlers), () => this.#send(msg, handlers));
    this.#queue = result.catch(() => {});
    return result;
  }

  /**
   * Sends one message after the queued ones have started, without holding back the ones after
   * it: generations on an engine with several slots, which the worker runs as one batch.
   * @param {RequestBody} msg
   * @param {Handlers} [handlers]
   * @returns {Promise<any>}
   */
  #callBeside(msg, handlers = {}) {
    const send = () => this.#send(msg, handlers);
    return this.#queue.then(send, send);
  }

  /**
   * Sends one message and waits for its answer, once the reload after a crash (if one runs) ends.
   * @param {RequestBody} msg
   * @param {Handlers} handlers
   * @returns {Promise<any>}
   */
  #send(msg, handlers) {
    const restarting = this.#restarting;
    if (restarting) return restarting.then(() => this.#send(msg, handlers));
    return this.#post(msg, handlers);
  }

  /**
   * Sends one message to the worker now and waits for its answer.
   * @param {RequestBody} msg
   * @param {Handlers} handlers
   * @returns {Promise<any>}
   */
  #post(msg, handlers) {
    if (this.#closed) return Promise.reject(this.#closed);
    const id = this.#nextId++;
    handlers.onStart?.(id);
    return new Promise((/** @type {(value: any) => void} */ resolve, reject) => {
      this.#pending.set(id, { resolve, reject, ...handlers });
      this.#worker.postMessage({ ...msg, id });
    });
  }

  /**
   * Sends `msg` to the worker now, for no answer of its own.
   * @param {EngineRequest} msg
   */
  #tell(msg) {
    this.#worker.postMessage(msg);
  }

  /**
   * @param {string | Blob | Blob[]} model
   * @param {CreateEngineOptions['onProgress']} onProgress
   * @param {Omit<CreateEngineOptions, 'model' | 'onProgress' | 'onStatus' | 'remote' | 'sha256' | 'persistPrefix' | 'draftModel'>} engineOptions the engine's own options
   * @param {string | string[] | undefined} sha256
   * @param {{ maxBytes: number } | null} persist `persistPrefix`
   * @param {string | Blob | Blob[] | undefined} draftModel
   */
  async _load(model, onProgress, engineOptions, sha256, persist, draftModel) {
    const load = { type: /** @type {const} */ ('load'), model, options: engineOptions, sha256, persist, draftModel };
    const info = await this.#call(load, { onProgress });
    this.info = { ...info, shared: this.#sharedInfo() };
    this.#setup = load;
    return this.info;
  }

  /**
   * Connects the worker to a remote server (createEngine's `remote`): its requests go there.
   * @param {RemoteOptions} remote
   * @param {KestrelError} reason why the model does not run here
   */
  async _connect(remote, reason) {
    const connect = { type: /** @type {const} */ ('connect'), remote };
    await this.#call(connect);
    this.#setup = connect;
    this.info = {
      backend: 'remote', fallback: { code: reason.code, message: reason.message },
      remote: { baseURL: remote.baseURL.replace(/\/+$/, ''), model: remote.model ?? 'kestrel' }, gpu: null, kind: null, model: null, version: null, shared: null,
    };
    return this;
  }

  /**
   * @param {'chat' | 'completions'} endpoint
   * @param {Partial<ChatCompletionRequest & CompletionRequest>} request
   */
  #create(endpoint, request) {
    // A model whose requests run as batched steps (several slots, or the CPU backend) takes
    // concurrent requests at once; a remote server too.
    const beside = this.info?.backend === 'remote' || (this.info?.kind === 'chat' && this.info.model.batched === true);
    const send = (/** @type {RequestBody} */ msg, /** @type {Handlers} */ handlers) => (beside ? this.#callBeside(msg, handlers) : this.#call(msg, handlers));
    // To the worker that runs the request now (a crash may have replaced the first).
    return openaiRequest(endpoint, request, send, (id) => this.#tell({ type: 'abort', id }));
  }

  /**
   * `rerank`: the documents scored against the query, best first, on a reranker (or a remote
   * server's /v1/rerank). Queued and aborted as `embeddings.create`.
   * @param {RerankParams} request
   * @returns {Promise<RerankResponse>}
   */
  rerank(request) {
    return this.#encode('rerank', request);
  }

  /**
   * `embeddings.create` (type 'embed') and `rerank`: queued like the other calls. An aborted
   * `signal` rejects at once with its reason; a call still queued is then never sent. One the
   * worker is running cannot be stopped mid-pass (it runs to the end on the GPU or the CPU
   * kernels and its answer is dropped); a remote engine's request is cancelled.
   * @param {'embed' | 'rerank'} type
   * @param {(EmbeddingCreateParams | RerankParams) & { signal?: AbortSignal }} request
   * @returns {Promise<any>}
   */
  #encode(type, request) {
    if (request === null || typeof request !== 'object') {
      const usage = type === 'embed'
        ? 'embeddings.create takes a request object: { input, dimensions?, encoding_format?, truncate?, signal? }'
        : 'rerank takes a request object: { query, documents, top_n?, return_documents?, signal? }';
      return Promise.reject(kestrelError('invalid_option', usage));
    }
    const { signal, ...body } = request;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    /** @type {number | null} */
    let sent = null;
    const send = () => {
      if (signal?.aborted) return Promise.reject(abortError(signal));
      return this.#send({ type, body }, { onStart: (id) => (sent = id) });
    };
    const result = this.#queue.then(send, send);
    this.#queue = result.catch(() => {});
    if (!signal) return result;
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        // Only a remote request can stop; a local pass finishes, its answer unread.
        if (sent !== null && this.info?.backend === 'remote') this.#tell({ type: 'abort', id: sent });
        reject(abortError(signal));
      };
      signal.addEventListener('abort', onAbort, { once: true });
      result.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
    });
  }

  /**
   * Test hook: destroys the worker's GPU device at once (not queued behind requests), as a driver
   * reset would lose it. The request in flight fails with `device_lost`; the engine recovers.
   */
  _destroyDevice() {
    this.#tell({ type: 'destroy-device', id: 0 });
  }

  /**
   * Test hook: traps the worker's wasm instance, `how`: 'panic', 'stack_overflow', or
   * 'panic_in_future' (in a future the wasm polls later, as a step's). Queued as a request, which
   * fails with `internal`; the engine then recovers. Only the browser suite's build of the wasm
   * has the trap (kestrel-wasm's `test-hooks`); the package's fails with `invalid_option`.
   * @param {'panic' | 'stack_overflow' | 'panic_in_future'} how
   */
  _trap(how) {
    return this.#call({ type: 'trap', how });
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

/**
 * Checks `remote` before anything loads.
 * @param {RemoteOptions} remote
 */
function checkRemote(remote) {
  if (typeof remote?.baseURL !== 'string' || !remote.baseURL) {
    throw kestrelError('invalid_option', 'invalid option remote.baseURL: expected the server\'s API URL, such as http://127.0.0.1:8080/v1');
  }
}

/**
 * What names a shared engine: the model's URL, its draft model's, and the engine's options (keys
 * sorted), so that tabs share an engine only where they asked for the same one.
 * @param {string | Blob | Blob[]} model
 * @param {Record<string, unknown>} engineOptions
 * @param {{ persist: unknown, draftModel: string | Blob | Blob[] | undefined }} others
 */
function sharedKey(model, engineOptions, { persist, draftModel }) {
  if (typeof model !== 'string' || (draftModel !== undefined && typeof draftModel !== 'string')) {
    throw kestrelError('invalid_option', 'invalid option shared: a shared engine loads its models from URLs (a File or a Blob belongs to one tab)');
  }
  if (persist) {
    throw kestrelError('invalid_option', 'invalid option shared: persistPrefix restores one conversation into a cache the other tabs are using; use one or the other');
  }
  if (!globalThis.navigator?.locks) {
    throw kestrelError('invalid_option', 'invalid option shared: the shared engine needs Web Locks (navigator.locks, in secure contexts)');
  }
  const sorted = Object.fromEntries(Object.entries(engineOptions).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  return `${model} ${draftModel ?? ''} ${JSON.stringify(sorted)}`;
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
 * A shared engine whose leading tab closed says 'leader_lost', 'reloading' (on the next tab in
 * line), then 'ready' or 'failed'. A crash of the engine (its WebAssembly trapped: a bug) fails
 * the request that caused it and those in flight with `internal`, then says 'crashed' (with
 * `error`), 'reloading' (the model in a new worker), 'ready' (or 'failed'); later requests wait.
 * `sha256` (hex): the file's digest, checked as it streams; a mismatch is `bad_model` and the
 * copy is not kept in the Cache API. `info.model_cache` says whether the Cache API kept the file
 * (not where the storage quota has no room: `quota_exceeded`).
 * `persistPrefix` (`true` or `{maxBytes}`): the conversation's KV rows are saved in the Origin
 * Private File System after each request, so a request after a page reload prefills only what
 * follows the saved tokens.
 * Before downloading a URL it checks from the header that the model fits (`estimate`), failing
 * with `device_limits` or `unsupported_quant` without fetching the weights.
 * `shared: true`: one engine for every tab of this origin that loads the same model URL with the
 * same options: the model loads once, and the tabs' requests run as one batch (with `slots`
 * above 1, or on the CPU backend). It runs in a SharedWorker, or where there is none in the
 * worker of a leading tab (Web Locks); a tab that closes ends only its own requests; when the
 * leading tab closes, another takes over and the requests in flight fail with `leader_lost`.
 * `engine.info.shared` says how this tab reaches it and how many tabs use it.
 * `speculative: {lookup, maxDraft}` with or without `draftModel` (a URL, a File or a Blob as
 * `model`, a smaller model with its vocabulary, loaded after it onto the CPU backend): speculative
 * decoding on either backend (`engine.info.speculative` says how it runs); a request's
 * `speculative: false` decodes plainly. The CPU backend's fit check counts the draft model.
 * `remote: {baseURL, apiKey, model}`: where the model cannot run here (`no_webgpu`,
 * `device_limits`, `out_of_memory`; with backend 'auto' only what the CPU path cannot run either),
 * the engine sends the same requests to that OpenAI-compatible server instead
 * (`engine.info.backend` is then 'remote').
 * @param {CreateEngineOptions} options
 * @returns {Promise<EngineApi>}
 */
export async function createEngine(options) {
  // The package's own options; the rest are the engine's, which the engine core names and checks
  // (kestrel_engine::EngineOptions): a bad or unknown one fails the load with `invalid_option`.
  const { model: given, draftModel: draftGiven, onProgress, onStatus, remote, sha256, persistPrefix, shared, ...engineOptions } = options ?? {};
  const model = modelOption(given);
  const draftModel = draftGiven == null ? undefined : modelOption(draftGiven, 'draftModel');
  // The engine's `speculative` option says how drafts are made; a draft model alone drafts with
  // its defaults. Prompt lookup or a draft model must make them.
  if (draftModel !== undefined) engineOptions.speculative ??= {};
  else if (engineOptions.speculative != null && engineOptions.speculative.lookup !== true) {
    throw kestrelError('invalid_option', 'invalid option speculative: drafts need lookup: true or a draftModel');
  }
  if (sha256 != null && !(Array.isArray(sha256) ? sha256 : [sha256]).every((d) => /^[0-9a-fA-F]{64}$/.test(d))) {
    throw kestrelError('invalid_option', 'invalid option sha256: expected 64 hexadecimal digits (an array of them for a split model, one per file)');
  }
  const persist = persistOption(persistPrefix);
  if (shared != null && typeof shared !== 'boolean') throw kestrelError('invalid_option', 'invalid option shared: expected true or false');
  const key = shared ? sharedKey(model, engineOptions, { persist, draftModel }) : null;
  if (remote != null) checkRemote(remote);
  /** @param {KestrelError} reason */
  const useRemote = (reason) => new Engine(startWorker(), onStatus)._connect(/** @type {RemoteOptions} */ (remote), reason);
  if (engineOptions.backend === 'webgpu' && !globalThis.navigator?.gpu) {
    const error = kestrelError('no_webgpu', 'WebGPU is not available in this browser (navigator.gpu is missing)');
    if (remote != null) return useRemote(error);
    throw error;
  }
  const worker = key === null ? startWorker() : await SharedEngineConnection.connect(key);
  const engine = new Engine(worker, onStatus);
  try {
    await engine._load(model, onProgress, engineOptions, sha256, persist, draftModel);
  } catch (e) {
    worker.terminate();
    const code = /** @type {KestrelError} */ (e)?.code;
    if (remote != null && FALL_THROUGH.has(code)) return useRemote(/** @type {KestrelError} */ (e));
    throw e;
  }
  return engine;
}
