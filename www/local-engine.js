// The engine on this browser: the wasm Engine (kestrel-engine's scheduler in the wasm module),
// which the host (engine-host.js) runs requests on. It steps the engine while requests run, loads
// models (model-load.js) and a draft model after its model on the CPU backend, recovers by itself
// from a lost GPU device (the model reloaded, the requests waiting for it), and with
// `persistPrefix` restores and saves KV prefixes.

/**
 * @import { EngineOptions, HostReply, LoadRequest, ModelInput, Persist, EngineRequest } from './protocol.d.ts'
 * @import { AnswerEvent, Engine as WasmEngine } from './wasm.d.ts'
 * @import { KestrelErrorCode } from './index.d.ts'
 * @import { DescribedAdapter } from './model-files.js'
 * @import { EngineBackend, HostLink } from './engine-host.js'
 * @import { LoadSetup } from './model-load.js'
 */

import { errorOf, isTrap, requestJson } from './engine-shared.js';
import { kestrelError } from './errors.js';
import { ModelLoad } from './model-load.js';
import { MIN_RESTORED_TOKENS, PrefixStore, sharedPrefix } from './prefix-store.js';
import { storageRoom } from './storage.js';
import { Engine, reusableTokens } from './wasm.js';

/** A generation the engine runs: the page's id, and how its answer settles. */
/** @typedef {{ id: number, resolve: (value: unknown) => void, reject: (error: unknown) => void }} Pending */

/** What reloads the model after a device loss: the last load's request. */
/**
 * @typedef {{
 *   model: ModelInput, engineOptions: EngineOptions, sha256: string | string[] | undefined, persist: Persist,
 *   draftModel: ModelInput | undefined,
 * }} LastLoad
 */

// The display's frame interval, measured from requestAnimationFrame as the worker starts (where
// the browser offers it to workers, and the page is visible), else that of 60 Hz.
const frameInterval = measureFrameInterval();

/** @returns {Promise<number>} */
function measureFrameInterval() {
  const fallback = 1000 / 60;
  if (typeof self.requestAnimationFrame !== 'function') return Promise.resolve(fallback);
  return new Promise((resolve) => {
    /** @type {number[]} */
    const stamps = [];
    const timer = setTimeout(() => resolve(fallback), 500);
    /** @param {number} t */
    const tick = (t) => {
      stamps.push(t);
      if (stamps.length < 6) {
        self.requestAnimationFrame(tick);
        return;
      }
      clearTimeout(timer);
      const gaps = stamps.slice(1).map((s, i) => s - stamps[i]).sort((a, b) => a - b);
      const median = gaps[gaps.length >> 1];
      resolve(median > 1 && median < 200 ? median : fallback);
    };
    self.requestAnimationFrame(tick);
  });
}

/**
 * `engineOptions` with the default submission budget where it sets none: half a frame, so that a
 * prompt's GPU work leaves the GPU process room to draw the page in every frame.
 * @param {EngineOptions} engineOptions
 */
async function withSubmitBudget(engineOptions) {
  if (engineOptions?.submit_budget_ms != null) return engineOptions;
  return { ...engineOptions, submit_budget_ms: (await frameInterval) / 2 };
}

/**
 * The browser reports a lost device after the errors the loss causes (a destroyed buffer used in a
 * submit): after a `gpu` error, waits briefly for a loss and returns it, else the error itself.
 * @param {WasmEngine} eng
 * @param {unknown} error
 */
async function lossBehind(eng, error) {
  for (let i = 0; i < 10; i++) {
    await new Promise((r) => setTimeout(r, 50));
    try {
      eng.checkDevice();
    } catch (fault) {
      if (/** @type {{ code?: string }} */ (fault)?.code === 'device_lost' || isTrap(fault)) return fault;
    }
  }
  return error;
}

/** @implements {EngineBackend} */
export class LocalEngine {
  /** @type {HostLink} */
  #host;
  /** @type {DescribedAdapter} */
  #adapter;
  /** @type {WasmEngine | null} */
  #engine = null;
  /** The loaded model's load, to reload it after a device loss. */
  /** @type {LastLoad | null} */
  #lastLoad = null;
  /** The reload under way after a device loss; requests wait for it. */
  /** @type {Promise<void> | null} */
  #recovery = null;
  /** The embedding or rerank call under way; the next waits for it. */
  /** @type {Promise<unknown>} */
  #encoding = Promise.resolve();
  /** The KV prefix being saved after a request; the next request waits for it. */
  /** @type {Promise<unknown>} */
  #saving = Promise.resolve();
  /** The saved KV prefixes of the loaded model, with `persistPrefix`. */
  /** @type {PrefixStore | null} */
  #prefixes = null;
  /** The loaded model's requests run as batched steps (info.model.batched). */
  #batched = false;
  /** Engine request id -> the page's request. */
  /** @type {Map<number, Pending>} */
  #requests = new Map();
  /** Page id -> engine request id, while the request runs (for its abort). */
  /** @type {Map<number, number>} */
  #engineIds = new Map();
  /** The stepping loop while it runs. */
  /** @type {Promise<void> | null} */
  #stepping = null;

  /**
   * @param {HostLink} host
   * @param {DescribedAdapter} adapter
   */
  constructor(host, adapter) {
    this.#host = host;
    this.#adapter = adapter;
  }

  /** @param {'generate' | 'embed' | 'rerank'} type */
  runsAtOnce(type) {
    // Batched: a generation joins the running steps instead of waiting for the requests before it.
    return type === 'generate' && this.#batched;
  }

  /** @param {EngineRequest['type']} type */
  async before(type) {
    if (this.#recovery && type !== 'estimate') await this.#recovery;
    if (type !== 'estimate' && type !== 'destroy-device') await this.#saving;
  }

  /**
   * Loads the model of `request`, after the running steps and encoding. A download cut short is
   * fetched again once, from the start: hosts that compress on the fly answer no Range to resume
   * from.
   * @param {LoadRequest} request
   */
  async load({ id, model, cache, options, sha256, persist, draftModel }) {
    await this.#stepping;
    await this.#encoding;
    const useCache = cache !== false;
    const last = { model, engineOptions: options, sha256, persist, draftModel };
    const info = await this.#load(id, useCache, last).catch((e) => {
      if (!e?.retryable) throw e;
      console.warn(`kestrel: ${e.message}; downloading it again`);
      return this.#load(id, useCache, last);
    });
    this.#lastLoad = last;
    return info;
  }

  /**
   * Loads `model`, then its draft model (on the CPU backend), into the engine.
   * @param {number} id
   * @param {boolean} useCache
   * @param {LastLoad} request
   */
  async #load(id, useCache, { model, engineOptions, sha256, persist, draftModel }) {
    this.#engine ??= await Engine.create(JSON.stringify(await withSubmitBudget(engineOptions)));
    this.#prefixes = null;
    /** @type {LoadSetup} */
    const setup = {
      id, model, useCache, engineOptions, sha256, persist, engine: this.#engine, adapter: this.#adapter, post: this.#host.post,
      cpuEngine: (reason) => this.#cpuEngine(engineOptions, reason), draftModel,
    };
    const { info, prefixes } = await new ModelLoad(setup).run();
    // The draft model runs on the CPU backend whichever backend verifies (engine.loadDraft).
    if (draftModel !== undefined && info.kind === 'chat') {
      const eng = /** @type {WasmEngine} */ (this.#engine);
      const draft = eng.loadDraft();
      try {
        const loaded = await new ModelLoad({ ...setup, engine: eng, model: draftModel, sha256: undefined, persist: null, draftModel: undefined, draft }).run();
        info.speculative = loaded.info.speculative;
      } finally {
        draft.free();
      }
    }
    this.#prefixes = prefixes;
    this.#batched = info.kind === 'chat' && info.model.batched === true;
    return info;
  }

  /**
   * Moves the engine to the CPU backend (with `backend` 'auto', for a model the GPU cannot hold).
   * @param {EngineOptions} engineOptions
   * @param {string} reason
   */
  async #cpuEngine(engineOptions, reason) {
    this.#engine?.free();
    this.#engine = await Engine.create(JSON.stringify({ ...engineOptions, backend: 'cpu', backend_reason: reason }));
    return this.#engine;
  }

  /**
   * Submits a generation (`body`: the page's OpenAI-shaped request for `endpoint`) to the engine
   * core and resolves to its answer: the whole completion, or null once a stream's chunks are all
   * posted. With `persistPrefix` (one request at a time), a saved KV prefix is restored before it
   * starts.
   * @param {number} id
   * @param {'chat' | 'completions'} endpoint
   * @param {Record<string, unknown>} body
   * @param {boolean} abortedEarly its abort came before it
   */
  async generate(id, endpoint, body, abortedEarly) {
    const eng = this.#engine;
    if (!eng) throw kestrelError('no_model', 'no model is loaded');
    const rid = eng.submit(endpoint, requestJson(body));
    this.#engineIds.set(id, rid);
    if (abortedEarly) eng.abort(rid);
    // One request at a time (persistPrefix's setting): nothing runs, the cache is free to restore.
    if (this.#prefixes && !this.#batched) await this.#restorePrefix(eng, this.#prefixes, rid);
    const answer = new Promise((resolve, reject) => this.#requests.set(rid, { id, resolve, reject }));
    this.#stepping ??= this.#step(eng).finally(() => {
      this.#stepping = null;
    });
    try {
      return await answer;
    } finally {
      this.#engineIds.delete(id);
    }
  }

  /**
   * Steps the engine while it has requests, yielding to the worker's event loop between steps so
   * that new requests join and aborts arrive. A step that fails as a whole (the model unloaded)
   * ends every request with its error.
   * @param {WasmEngine} eng
   */
  async #step(eng) {
    while (eng.hasWork()) {
      try {
        await eng.step((event) => this.#onEngineEvent(event));
      } catch (e) {
        for (const r of this.#requests.values()) r.reject(e);
        this.#requests.clear();
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 0));
    }
  }

  /**
   * One event of the engine core: a streamed chunk, a request's end or its error.
   * @param {AnswerEvent} event
   */
  #onEngineEvent(event) {
    const r = this.#requests.get(event.id);
    if (!r) return;
    if (event.chunk) {
      this.#host.post({ type: 'token', id: r.id, chunk: event.chunk });
      return;
    }
    this.#requests.delete(event.id);
    if (event.error) {
      // Rejected with the device loss behind a GPU error, recovering from it.
      const error = kestrelError(/** @type {KestrelErrorCode} */ (event.error.code), event.error.message);
      this.#deviceFault(error).then(r.reject);
      return;
    }
    r.resolve(event.result);
    // Saved after the answer, once the step ends; the next request waits for it.
    if (this.#prefixes && !this.#batched) this.#saving = this.#saving.then(() => this.#stepping).then(() => this.#savePrefix());
  }

  /**
   * The error a request fails with: `error`, or the device loss behind a GPU error. After a loss
   * the engine recovers by itself for the next request.
   * @param {unknown} error
   */
  async #deviceFault(error) {
    const e = /** @type {{ code?: string }} */ (error)?.code === 'gpu' && this.#engine ? await lossBehind(this.#engine, error) : error;
    if (/** @type {{ code?: string }} */ (e)?.code === 'device_lost' && this.#lastLoad && !this.#recovery) this.#recovery = this.#recover(this.#lastLoad);
    return e;
  }

  /**
   * After a device loss: a new device, and the model reloaded (from the Cache API for a URL, else
   * from the same File or Blob). Reports each stage as a 'status' message.
   * @param {LastLoad} last
   */
  async #recover(last) {
    const { post, callError } = this.#host;
    post({ type: 'status', status: 'device_lost' });
    // The browser may offer another adapter after a loss.
    this.#adapter.forget();
    this.#engine?.unload();
    this.#engine?.free();
    this.#engine = null;
    try {
      post({ type: 'status', status: 'reloading' });
      const info = await this.#load(0, true, last);
      post({ type: 'status', status: 'ready', info });
    } catch (e) {
      this.#lastLoad = null;
      post({ type: 'status', status: 'failed', error: errorOf(callError(e)) });
    } finally {
      this.#recovery = null;
    }
  }

  /**
   * Embeds the inputs of `body` (`embeddings.create`'s argument without `signal`, type 'embed') or
   * scores its documents against its query (`rerank`'s, type 'rerank') on the loaded model, on the
   * GPU or the CPU kernels: the answer's JSON. One at a time (the tabs of a shared engine may
   * overlap): a decoder embedding model's KV cache serves one call; one queued behind a call that
   * lost the device waits for the reload. A pass runs to its end once started (the page stops
   * waiting for an aborted call's answer, and sends no abort for it). A lost device fails the
   * call with `device_lost`, and the engine recovers for the next.
   * @param {'embed' | 'rerank'} type
   * @param {number} _id
   * @param {Record<string, unknown>} body
   */
  encode(type, _id, body) {
    const run = this.#encoding.then(async () => {
      if (this.#recovery) await this.#recovery;
      const eng = this.#engine;
      if (!eng) throw kestrelError('no_model', 'no model is loaded');
      try {
        return await (type === 'embed' ? eng.embed(JSON.stringify(body)) : eng.rerank(JSON.stringify(body)));
      } catch (e) {
        throw await this.#deviceFault(e);
      }
    });
    this.#encoding = run.catch(() => {});
    return run;
  }

  /** @param {number} id */
  abort(id) {
    const rid = this.#engineIds.get(id);
    if (rid === undefined) return false;
    this.#engine?.abort(rid);
    return true;
  }

  /** Forgets the cached conversation, after the batched requests before it. */
  async reset() {
    await this.#stepping;
    this.#engine?.reset();
  }

  /** Drops the model: the requests in flight end with `no_model`. */
  unload() {
    const gone = kestrelError('no_model', 'the model was unloaded');
    for (const r of this.#requests.values()) r.reject(gone);
    this.#requests.clear();
    this.#engine?.unload();
    this.#lastLoad = null;
    this.#prefixes = null;
    this.#batched = false;
  }

  /** The test hook of the device-loss recovery: loses the device as a driver reset would. */
  destroyDevice() {
    this.#engine?.destroyDevice();
  }

  /**
   * The test hook of the crash recovery: traps the instance, `how` as `trapForTest` says. Only
   * the browser suite's build of the wasm (kestrel-wasm's `test-hooks`) has it.
   * @param {string} how
   */
  trap(how) {
    const trapForTest = this.#engine?.trapForTest;
    if (typeof trapForTest !== 'function') throw kestrelError('invalid_option', 'this build of the engine has no test hooks');
    return trapForTest.call(this.#engine, how);
  }

  /**
   * With `persistPrefix`: before submitted request `rid` starts, restores the rows of the saved KV
   * prefix that shares the most tokens with its prompt, where that beats what the cache holds by
   * enough to pay for reading it. A corrupt snapshot is deleted; one of another setup (context,
   * cache type) is left for it. Any failure here only means the request prefills more.
   * @param {WasmEngine} eng
   * @param {PrefixStore} prefixes
   * @param {number} rid
   */
  async #restorePrefix(eng, prefixes, rid) {
    const prompt = eng.promptTokens(rid);
    const have = reusableTokens(sharedPrefix(eng.cachedTokenIds(), prompt), prompt.length);
    if (reusableTokens(prompt.length, prompt.length) < have + MIN_RESTORED_TOKENS) return;
    let entry = null;
    try {
      const best = await prefixes.best(prompt);
      if (!best.entry || reusableTokens(best.shared, prompt.length) < have + MIN_RESTORED_TOKENS) return;
      entry = best.entry;
      eng.restorePrefix(prefixes.modelKey, await prefixes.read(entry), best.shared);
    } catch (e) {
      if (isTrap(e)) throw e;
      const { code, message } = /** @type {{ code?: string, message?: string }} */ (e ?? {});
      console.warn('kestrel: a saved KV prefix was not restored:', message ?? e);
      if (code === 'bad_snapshot' && entry) await prefixes.remove(entry.name);
      if (code === 'snapshot_mismatch' && entry) prefixes.refused.add(entry.name);
    }
  }

  /**
   * With `persistPrefix`: saves the cached prefix after a request, as much of it as the byte budget
   * and the storage quota allow (a failure loses only the save). Nothing where the model was
   * unloaded meanwhile.
   */
  async #savePrefix() {
    const eng = this.#engine;
    const prefixes = this.#prefixes;
    if (!eng || !prefixes) return;
    try {
      const budget = Math.min(prefixes.maxBytes, await storageRoom());
      const bytes = await eng.savePrefix(prefixes.modelKey, budget);
      if (!bytes) {
        console.warn(`kestrel: the KV prefix was not saved: not one token fits ${budget} bytes (the budget or the storage quota)`);
        return;
      }
      await prefixes.save(bytes);
    } catch (e) {
      if (isTrap(e)) throw e;
      console.warn('kestrel: could not save the KV prefix:', /** @type {Error} */ (e)?.message ?? e);
    }
  }
}
