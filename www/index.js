// Kestrel's browser package: an OpenAI-style API over the wasm engine, which runs in a module
// Web Worker (worker.js) so the page's main thread never waits on it.

const CACHE_NAME = 'kestrel-models';

function kestrelError(code, message) {
  return Object.assign(new Error(message), { code });
}

/** Whether the Cache API holds the model at `url` (stored by an earlier load). */
export async function hasModelInCache(url) {
  if (!globalThis.caches) return false;
  const cache = await caches.open(CACHE_NAME);
  return Boolean(await cache.match(new URL(url, location.href).href));
}

/** Removes the model at `url` from the Cache API; true when there was one. */
export async function deleteModelFromCache(url) {
  if (!globalThis.caches) return false;
  const cache = await caches.open(CACHE_NAME);
  return cache.delete(new URL(url, location.href).href);
}

/** A queue of values consumed with `for await`; `onCancel` runs when the consumer stops early. */
function channel(onCancel) {
  const items = [];
  let wake = null;
  let done = false;
  let failure = null;
  const notify = () => {
    if (wake) wake();
    wake = null;
  };
  return {
    push(v) { items.push(v); notify(); },
    end() { done = true; notify(); },
    fail(e) { failure = e; done = true; notify(); },
    async *[Symbol.asyncIterator]() {
      try {
        for (;;) {
          if (items.length) yield items.shift();
          else if (failure) throw failure;
          else if (done) return;
          else await new Promise((r) => (wake = r));
        }
      } finally {
        if (!done) onCancel?.();
      }
    },
  };
}

const SAMPLING_KEYS = [
  'max_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'seed', 'stop', 'stop_token_ids',
  'logit_bias', 'repetition_penalty', 'frequency_penalty', 'presence_penalty', 'penalty_last_n',
  'ignore_eos',
];

function usageOf(r) {
  const t = r.timings;
  const completion = r.token_ids.length;
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
      e2e_latency_s: t.e2e_ms / 1e3,
    },
  };
}

class Engine {
  #worker;
  #nextId = 1;
  #pending = new Map(); // id -> {resolve, reject, onToken, onProgress}
  #queue = Promise.resolve();
  #closed = null;
  /** `{gpu: {adapter, backend, driver, features, limits}, model: {...}, version}` once loaded. */
  info = null;

  constructor(worker) {
    this.#worker = worker;
    worker.onmessage = ({ data }) => this.#onMessage(data);
    worker.onerror = (e) => this.#fail(kestrelError('worker_error', `the engine's worker failed: ${e.message || 'could not start it'}`));
    const completions = (kind) => ({ create: (request) => this.#create(kind, request) });
    this.chat = { completions: completions('chat') };
    this.completions = completions('text');
  }

  #onMessage(msg) {
    const p = this.#pending.get(msg.id);
    if (!p) return;
    if (msg.type === 'progress') p.onProgress?.(msg.progress);
    else if (msg.type === 'token') p.onToken?.(msg.text, msg.tokenId);
    else {
      this.#pending.delete(msg.id);
      if (msg.type === 'result') p.resolve(msg.value);
      else p.reject(kestrelError(msg.error.code, msg.error.message));
    }
  }

  #fail(error) {
    this.#closed ??= error;
    for (const p of this.#pending.values()) p.reject(error);
    this.#pending.clear();
  }

  /** Sends one message and waits for its answer; requests run one at a time, in order. */
  #call(msg, handlers = {}, transfer) {
    const run = () => {
      if (this.#closed) return Promise.reject(this.#closed);
      const id = this.#nextId++;
      handlers.onStart?.(id);
      return new Promise((resolve, reject) => {
        this.#pending.set(id, { resolve, reject, ...handlers });
        this.#worker.postMessage({ ...msg, id }, transfer ?? []);
      });
    };
    const result = this.#queue.then(run, run);
    this.#queue = result.catch(() => {});
    return result;
  }

  async _load(model, onProgress, gpu) {
    this.info = await this.#call({ type: 'load', model, gpu }, { onProgress });
    return this.info;
  }

  #create(kind, request) {
    const { messages, prompt, stream = false, signal, logprobs, top_logprobs } = request ?? {};
    const body = {};
    for (const k of SAMPLING_KEYS) if (request?.[k] != null) body[k] = request[k];
    if (kind === 'chat') body.messages = messages;
    else body.prompt = prompt;
    if (logprobs) body.logprobs = top_logprobs ?? 1;
    const created = Math.floor(Date.now() / 1000);
    const model = this.info?.model?.name ?? 'kestrel';
    const object = kind === 'chat' ? 'chat.completion' : 'text_completion';
    let requestId = null;
    let cancelled = false;
    // Leaving a `for await` early (break, throw) aborts the generation like the signal does.
    const out = channel(() => {
      cancelled = true;
      onAbort();
    });
    const choice = (text, extra) =>
      kind === 'chat' ? { index: 0, delta: text === null ? {} : { role: 'assistant', content: text }, logprobs: null, ...extra }
        : { index: 0, text: text ?? '', logprobs: null, ...extra };
    const chunk = (choices, more) => ({ id: `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestId}`, object: kind === 'chat' ? 'chat.completion.chunk' : 'text_completion', created, model, choices, ...more });

    function onAbort() {
      if (requestId !== null) worker.postMessage({ type: 'abort', id: requestId });
    }
    const worker = this.#worker;
    signal?.addEventListener('abort', onAbort, { once: true });
    const result = this.#call({ type: 'generate', request: body }, {
      onStart: (id) => {
        requestId = id;
        // Aborted while queued: the worker drops it before its first token.
        if (signal?.aborted || cancelled) queueMicrotask(onAbort);
      },
      onToken: stream ? (text, tokenId) => out.push(chunk([choice(text, { finish_reason: null, token_id: tokenId ?? null })])) : null,
    }).finally(() => signal?.removeEventListener('abort', onAbort));

    const final = (r) => {
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
    return result.then((r) => {
      const c = kind === 'chat'
        ? { index: 0, message: { role: 'assistant', content: r.text }, finish_reason: r.finish_reason, logprobs: null }
        : { index: 0, text: r.text, finish_reason: r.finish_reason, logprobs: null };
      return { id: `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestId}`, object, created, model, choices: [c], ...final(r) };
    });
  }

  /** Forgets the conversation cached on the GPU (the next request prefills from scratch). */
  reset() {
    return this.#call({ type: 'reset' });
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
 * Starts a worker, creates the GPU device in it and loads `model` (a URL, a File or a Blob).
 * Resolves once the model is ready. `onProgress({phase, loaded, total})` follows the load:
 * phase 'download' | 'cache' | 'upload' (a local File/Blob) | 'compile' | 'ready'.
 * `gpu: {allow_f16, allow_subgroups, allow_timestamps}` forces optional GPU features off;
 * `context_length` sizes the KV cache (default: the model's context, at most 4096).
 */
export async function createEngine({ model, onProgress, gpu, context_length } = {}) {
  if (!globalThis.navigator?.gpu) {
    throw kestrelError('no_webgpu', 'WebGPU is not available in this browser (navigator.gpu is missing)');
  }
  if (!(typeof model === 'string' || model instanceof URL || model instanceof Blob)) {
    throw kestrelError('invalid_option', 'invalid option model: expected a URL, a File or a Blob');
  }
  const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  const engine = new Engine(worker);
  try {
    await engine._load(model instanceof URL ? model.href : typeof model === 'string' ? new URL(model, location.href).href : model, onProgress, { ...gpu, context_length });
  } catch (e) {
    worker.terminate();
    throw e;
  }
  return engine;
}
