// One load of a model into the wasm engine, in named steps: the files and their Cache API copies
// (`plan`), the check that the model fits before gigabytes stream (`fittingEngine`), each file
// streamed into the engine (`stream`), then the compile and what the page learns of the load
// (`finish`). A draft model (speculative decoding's) loads the same way after its model, into the
// engine's `DraftLoad`. A failed load leaves no file in the Cache API.

/**
 * @import { EngineInfo, LoadProgress } from './index.d.ts'
 * @import { EngineOptions, HostReply, ModelInput, Persist } from './protocol.d.ts'
 * @import { DraftLoad, Engine as WasmEngine, LoadChunkProgress } from './wasm.d.ts'
 * @import { DescribedAdapter } from './model-files.js'
 */

import { adapterName } from './adapter-name.js';
import { isTrap } from './engine-shared.js';
import { kestrelError } from './errors.js';
import { estimate, modelFiles, notAModel } from './model-files.js';
import { PrefixStore } from './prefix-store.js';
import { CACHE_NAME, SHARD_HEADER, storageRoom } from './storage.js';
import { Sha256Hasher } from './wasm.js';

/**
 * What a load needs: the page's request, the engine to load into, how to move to the CPU backend
 * where the GPU cannot hold the model (it replaces the engine), the adapter it describes, and
 * where its progress goes. `draftModel`: the model's draft model, which its fit check counts.
 * `draft`: this load is a draft model's, its bytes going there (no fit check: its model's counted
 * it; no KV prefixes).
 * @typedef {{
 *   id: number, model: ModelInput, useCache: boolean, engineOptions: EngineOptions, sha256: string | string[] | undefined,
 *   persist: Persist, engine: WasmEngine, cpuEngine: (reason: string) => Promise<WasmEngine>, adapter: DescribedAdapter,
 *   post: (msg: HostReply) => void, draftModel?: ModelInput, draft?: DraftLoad,
 * }} LoadSetup
 */

/** Why the Cache API keeps no copy (`info.model_cache.error`). */
/** @typedef {{ code: 'quota_exceeded' | 'cache_failed', message: string }} CacheError */

/**
 * @param {number} bytes
 * @returns {CacheError}
 */
const quotaExceeded = (bytes) => ({
  code: 'quota_exceeded',
  message: `the model (${bytes ? `${(bytes / 1e6).toFixed(1)} MB` : 'its size unknown'}) does not fit this site's storage quota, so it is not cached and will be downloaded again next time`,
});

/**
 * The error of a download that ended, or failed, after `received` of the `expected` bytes
 * (0: unknown): `fetch_failed`, naming both, and `retryable` (the load is tried again once).
 * @param {string} url
 * @param {number} received
 * @param {number} expected
 * @param {unknown} [cause] the stream's error, where it failed rather than ended
 */
function cutShort(url, received, expected, cause) {
  const of = expected ? ` of ${expected}` : '';
  const why = cause ? `: ${/** @type {Error} */ (cause).message}` : '';
  return Object.assign(kestrelError('fetch_failed', `the download of ${url} ended after ${received}${of} bytes${why}; no copy of it was kept`), { retryable: true });
}

/**
 * The digest that names a model: its file's sha256, or a split model's: of its shards' digests.
 * @param {string[]} digests
 */
function modelDigest(digests) {
  if (digests.length === 1) return digests[0];
  const hasher = new Sha256Hasher();
  hasher.update(new TextEncoder().encode(digests.join('\n')));
  const digest = hasher.finishHex();
  hasher.free();
  return digest;
}

/**
 * Streams a model (a URL string, a Blob or a File, or an array of a split model's shards; a URL
 * that names a split model's first shard brings the others) into the engine, with progress
 * events. With `persist` (`{maxBytes}`), opens the store of saved KV prefixes under the file's
 * sha256 (a split model's: of its shards' digests).
 */
export class ModelLoad {
  /** @type {LoadSetup} */
  #setup;
  /** @type {WasmEngine} */
  #engine;
  /** @type {(string | Blob)[]} */
  #files = [];
  /** The digests `sha256` expects, one per file; null without the option. */
  /** @type {string[] | null} */
  #expected = null;
  /** The files' digests: they check the files against `sha256`, and key the saved KV prefixes. */
  /** @type {string[] | null} */
  #digests = null;
  /** @type {LoadProgress['phase']} */
  #phase = 'upload';
  #total = 0;
  #loaded = 0;
  /** @type {Cache | null} */
  #cache = null;
  /** Per file: the Cache API's copy (a URL's, from an earlier load), and the copy being stored. */
  /** @type {(Response | null)[]} */
  #hits = [];
  /** @type {(Promise<unknown> | null)[]} */
  #cachePuts = [];
  /** Why the Cache API keeps no copy, where it could not (`info.model_cache`). */
  /** @type {CacheError | null} */
  #cacheError = null;
  /** Per file downloaded now: its Content-Length (0 where the host sent none). */
  /** @type {number[]} */
  #lengths = [];
  /** @type {ReadableStreamDefaultReader<Uint8Array> | null} */
  #reader = null;
  /** @type {LoadChunkProgress | null} */
  #progress = null;
  /** A split model's shard being read (from 1). */
  #shard = 0;
  #lastReport = 0;

  /** @param {LoadSetup} setup */
  constructor(setup) {
    this.#setup = setup;
    this.#engine = setup.engine;
  }

  get #shards() {
    return this.#files.length;
  }

  /** Where the bytes go: the engine, or a draft model's load. */
  get #target() {
    return this.#setup.draft ?? this.#engine;
  }

  /**
   * Runs the load: resolves to the engine's info and the store of saved KV prefixes (null
   * without `persist`, or where it is off).
   * @returns {Promise<{ info: EngineInfo, prefixes: PrefixStore | null }>}
   */
  async run() {
    this.#files = modelFiles(this.#setup.model);
    this.#checkDigests();
    await this.#plan();
    try {
      for (let k = 0; k < this.#shards; k++) await this.#stream(k);
      return await this.#finish();
    } catch (e) {
      // A trap (an allocation failure, most likely here) left the engine unusable: no more calls.
      if (isTrap(e)) throw e;
      await this.#abandon();
      throw e;
    }
  }

  /** `sha256`: one digest per file. */
  #checkDigests() {
    const { sha256, persist } = this.#setup;
    this.#expected = sha256 == null ? null : [sha256].flat();
    if (this.#expected && this.#expected.length !== this.#shards) {
      throw kestrelError('invalid_option', `invalid option sha256: one digest per file of the model (${this.#shards}), not ${this.#expected.length}`);
    }
    this.#digests = this.#expected || persist ? [] : null;
    this.#hits = this.#files.map(() => null);
    this.#cachePuts = this.#files.map(() => null);
    this.#lengths = this.#files.map(() => 0);
  }

  /**
   * Where the bytes come from (the Cache API, a download, a File or Blob) and how many there are,
   * with the fit check before any download or upload.
   */
  async #plan() {
    const files = this.#files;
    if (typeof files[0] !== 'string') {
      // The same check from the files' headers, before streaming gigabytes into the engine.
      await this.#fittingEngine();
      this.#total = files.reduce((sum, blob) => sum + /** @type {Blob} */ (blob).size, 0);
      return;
    }
    const cache = this.#setup.useCache && self.caches ? await caches.open(CACHE_NAME) : null;
    this.#cache = cache;
    if (cache) this.#hits = await Promise.all(/** @type {string[]} */ (files).map(async (url) => (await cache.match(url)) ?? null));
    if (this.#hits.every(Boolean)) {
      this.#phase = 'cache';
      this.#total = this.#hits.reduce((sum, hit) => sum + (Number(hit?.headers.get('content-length')) || 0), 0);
      return;
    }
    // Before downloading gigabytes, check from the headers alone that the model fits the GPU, or
    // with backend 'auto' the CPU backend where the GPU cannot hold it, or on the CPU backend
    // wasm memory.
    const fileBytes = await this.#fittingEngine();
    this.#phase = 'download';
    // A split model's size from its headers; one file's from its Content-Length (`open`).
    if (this.#shards > 1) this.#total = fileBytes;
  }

  /**
   * The engine to load the model on, judged from its header before any weight is read; resolves
   * to the model's size from it (`file_bytes`). On WebGPU: the GPU where the model fits it (every
   * binding, and the total within what the GPU can plausibly hold); with backend 'auto',
   * otherwise the CPU backend where the model fits 32-bit wasm memory. On the CPU backend ('cpu',
   * or 'auto' without a usable GPU): the engine where the model fits wasm memory. Otherwise fails
   * with the verdict's code and numbers: `device_limits` (which a `remote` server takes over) or
   * `unsupported_quant`.
   */
  async #fittingEngine() {
    const { model, engineOptions, adapter, draftModel, draft } = this.#setup;
    // A draft model's load: its model's check counted it (its size then comes from the stream).
    if (draft) return 0;
    const onGpu = this.#engine.backend() === 'webgpu';
    const fits = await estimate(model, engineOptions ?? {}, adapter, { gpu: onGpu, draft: draftModel });
    const { cpu } = fits;
    if (!onGpu) {
      if (!cpu.fits) throw kestrelError(cpu.code ?? 'device_limits', `the model does not fit this device: ${cpu.reason}`);
      return fits.file_bytes;
    }
    if (fits.fits !== false) return fits.file_bytes;
    if ((engineOptions?.backend ?? 'auto') !== 'auto' || fits.code === 'unsupported_quant') {
      throw kestrelError(fits.code ?? 'device_limits', `the model does not fit this device: ${fits.reason}`);
    }
    if (!cpu.fits) throw kestrelError(cpu.code ?? 'device_limits', `the model fits neither the GPU (${fits.reason}) nor the CPU backend (${cpu.reason})`);
    this.#engine = await this.#setup.cpuEngine(`the model does not fit the GPU: ${fits.reason}`);
    return fits.file_bytes;
  }

  /**
   * The body of file `k`, downloading it (and storing a copy in the Cache API) where needed.
   * @param {number} k
   * @returns {Promise<ReadableStream<Uint8Array>>}
   */
  async #open(k) {
    const file = this.#files[k];
    if (file instanceof Blob) return file.stream();
    const hit = this.#hits[k];
    if (hit?.body) return hit.body;
    let response;
    try {
      response = await fetch(file);
    } catch (e) {
      throw kestrelError('fetch_failed', `could not fetch ${file}: ${/** @type {Error} */ (e).message}`);
    }
    const wrong = notAModel(response, file);
    if (wrong) throw wrong;
    if (!response.body) throw kestrelError('fetch_failed', `could not fetch ${file}: HTTP ${response.status} without a body`);
    const length = Number(response.headers.get('content-length')) || 0;
    const shards = this.#shards;
    this.#lengths[k] = length;
    if (shards === 1) this.#total = length;
    let body = response.body;
    if (this.#cache && length > (await storageRoom())) {
      this.#cacheError = quotaExceeded(shards > 1 ? this.#total : length);
      this.#cache = null;
    }
    if (this.#cache) {
      // One branch feeds the engine, the other the Cache API (committed only when complete),
      // each shard marked with the model it belongs to (the first shard's URL).
      const [mine, cached] = body.tee();
      body = mine;
      const headers = new Headers(response.headers);
      if (shards > 1) headers.set(SHARD_HEADER, `${k + 1}/${shards} ${this.#files[0]}`);
      this.#cachePuts[k] = this.#cache.put(file, new Response(cached, { headers })).catch((e) => e);
    }
    return body;
  }

  /** Reports the bytes and tensors read so far. */
  #report() {
    const progress = this.#progress;
    this.#setup.post({
      type: 'progress',
      id: this.#setup.id,
      progress: {
        phase: this.#phase,
        loaded: this.#loaded,
        total: this.#total,
        tensors: progress?.tensors_loaded ?? 0,
        tensorsTotal: progress?.tensors_total ?? 0,
        ...(this.#shards > 1 ? { shard: this.#shard, shards: this.#shards } : {}),
        ...this.#draftFlag,
      },
    });
  }

  /** What marks a draft model's progress. */
  get #draftFlag() {
    return this.#setup.draft ? { draft: true } : {};
  }

  /**
   * Streams file `k` into the engine, hashing it where its digest is needed.
   * @param {number} k
   */
  async #stream(k) {
    const eng = this.#target;
    const shards = this.#shards;
    if (k > 0) eng.loadNextShard();
    this.#shard = k + 1;
    const reader = (await this.#open(k)).getReader();
    this.#reader = reader;
    // Each shard's start is reported, however soon the last report was.
    if (shards > 1) this.#report();
    const hasher = this.#digests ? new Sha256Hasher() : null;
    // A download (not a File, a Blob or the Cache API's copy) can be cut short.
    const file = this.#files[k];
    const downloading = typeof file === 'string' && !this.#hits[k] ? file : null;
    let fileLoaded = 0;
    for (;;) {
      const { done, value } = await reader.read().catch((e) => {
        throw downloading ? cutShort(downloading, fileLoaded, this.#lengths[k], e) : e;
      });
      if (done) break;
      fileLoaded += value.byteLength;
      this.#loaded += value.byteLength;
      hasher?.update(value);
      this.#progress = eng.loadChunk(value);
      // Without a Content-Length (a host compressing on the fly) the header gives the size.
      if (!this.#total && this.#progress.file_bytes) this.#total = this.#progress.file_bytes;
      const now = performance.now();
      if (now - this.#lastReport > 50) {
        this.#lastReport = now;
        this.#report();
      }
    }
    this.#reader = null;
    // A stream that ends before the size its host or the file's header declared is a download
    // cut short (a host or proxy compressing on the fly, a dropped connection), not a bad file.
    const declared = this.#lengths[k] || (shards === 1 ? this.#progress?.file_bytes ?? 0 : 0);
    if (downloading && fileLoaded < declared) throw cutShort(downloading, fileLoaded, declared);
    if (hasher && this.#digests) {
      const digest = hasher.finishHex();
      hasher.free();
      this.#digests.push(digest);
      // Checked before the model is built; a mismatch also drops the copy the Cache API got.
      const expected = this.#expected?.[k];
      if (expected && digest !== expected.toLowerCase()) {
        const ofShard = shards > 1 ? ` (shard ${k + 1} of ${shards})` : '';
        throw kestrelError('bad_model', `bad model file${ofShard}: its sha256 is ${digest}, not the expected ${expected}`);
      }
    }
  }

  /**
   * Builds the model from the streamed bytes, and completes its info: the browser's adapter,
   * whether `persistPrefix` works, whether the Cache API kept the files.
   * @returns {Promise<{ info: EngineInfo, prefixes: PrefixStore | null }>}
   */
  async #finish() {
    const { id, post } = this.#setup;
    // A split model's total from its headers leaves out its later shards' headers.
    this.#total = Math.max(this.#total, this.#loaded);
    this.#report();
    post({ type: 'progress', id, progress: { phase: 'compile', loaded: this.#loaded, total: this.#total, ...this.#draftFlag } });
    const info = await this.#target.finishLoad();
    await this.#describeAdapter(info);
    // A draft model's load adds no KV prefixes (its model's store has them).
    const prefixes = this.#setup.draft ? null : await this.#openPrefixes(info);
    const { stored, error } = await this.#cacheOutcome();
    info.model_cache = { stored, error };
    post({ type: 'progress', id, progress: { phase: 'ready', loaded: this.#loaded, total: this.#total, ...this.#draftFlag } });
    return { info, prefixes };
  }

  /**
   * Adds the browser's own adapter description (wgpu's name is often empty on the web).
   * @param {EngineInfo} info
   */
  async #describeAdapter(info) {
    const i = (await this.#setup.adapter.get())?.info;
    if (!info.gpu || !i) return;
    info.gpu.adapter_info = { vendor: i.vendor, architecture: i.architecture, device: i.device, description: i.description };
    if (!info.gpu.adapter) info.gpu.adapter = adapterName(i);
  }

  /**
   * With `persist`: the store of saved KV prefixes, and whether it works here
   * (`info.persist_prefix`).
   * @param {EngineInfo} info
   */
  async #openPrefixes(info) {
    const { persist, engineOptions } = this.#setup;
    let persistOff = null;
    /** @type {PrefixStore | null} */
    let prefixes = null;
    if (persist && info.backend === 'cpu') {
      persistOff = 'the CPU backend keeps no KV prefix snapshots (they are copies of GPU buffers)';
    } else if (persist) {
      // Keyed by the file and the cache's value type: an f32 engine's snapshots neither serve nor
      // supersede an f16 one's.
      const key = `${modelDigest(/** @type {string[]} */ (this.#digests))}:${engineOptions?.kv_cache ?? 'f16'}`;
      prefixes = await PrefixStore.open(key, persist.maxBytes).catch((e) => {
        persistOff = `the Origin Private File System is not available: ${e?.message ?? e}`;
        return null;
      });
    }
    if (persistOff) console.warn(`kestrel: persistPrefix is off: ${persistOff}`);
    info.persist_prefix = persist ? { enabled: !persistOff, reason: persistOff } : null;
    return prefixes;
  }

  /** Whether the Cache API kept every file, and why not where storing one failed. */
  async #cacheOutcome() {
    for (const put of this.#cachePuts) {
      const err = put && (await put);
      if (err instanceof Error && !this.#cacheError) {
        this.#cacheError = err.name === 'QuotaExceededError'
          ? quotaExceeded(this.#total)
          : { code: 'cache_failed', message: `could not store the model in the Cache API: ${err.message}` };
      }
    }
    // The model runs from the network either way; the page learns why it will download it again.
    if (this.#cacheError) console.warn(`kestrel: ${this.#cacheError.message}`);
    const files = this.#files;
    const stored = typeof files[0] === 'string' && files.every((_, k) => this.#hits[k] || this.#cachePuts[k]) && !this.#cacheError;
    return { stored, error: this.#cacheError };
  }

  /**
   * After a failure: the download stopped, the engine's load abandoned, and no file kept (a corrupt
   * download would otherwise stick), nor the other shards of its model.
   */
  async #abandon() {
    this.#reader?.cancel().catch(() => {});
    this.#target.cancelLoad();
    const cache = this.#cache;
    if (cache && typeof this.#files[0] === 'string') {
      await Promise.all(this.#cachePuts.filter(Boolean));
      await Promise.all(this.#files.map((url) => cache.delete(/** @type {string} */ (url))));
    }
  }
}
