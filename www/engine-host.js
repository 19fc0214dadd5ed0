// The engine a worker hosts: the wasm Engine, or for a remote engine the connection to its server.
// Its clients talk to it with messages ({type, id, ...}) through `handleMessage`; it answers with
// 'progress', 'token' (a streamed chunk), 'result' and 'error' messages, and reports 'status' (a
// device loss and the recovery from it, a crash) to every client, through the function
// `setOutbound` gives it. worker.js hosts it for one page; shared-worker.js for every tab of an
// origin. The engine core (kestrel-engine, in the wasm module) schedules the requests and writes
// their answers in OpenAI's shape; this module carries its events. The page (index.js) queues
// requests, except generations on an engine that batches them (`info.model.batched`): those come
// at once and join the running steps. A trap of the wasm instance (a Rust panic, a stack
// overflow, an allocation failure) ends the engine for good: every call fails with `internal`,
// and the status 'crashed' tells the clients, whose page replaces this worker with a new one.
import init, { Engine, HeaderProbe, RemoteAnswer, Sha256Hasher, checkEmbeddingRequest, checkRerankRequest, reportPanicsTo, reusableTokens, shardNames } from './pkg/kestrel_wasm.js';
import { MIN_RESTORED_TOKENS, PrefixStore, sharedPrefix } from './prefix-store.js';
import { adapterName } from './adapter-name.js';
import { CACHE_NAME, SHARD_HEADER, storageRoom } from './storage.js';
import { RemoteBackend } from './remote.js';

let engine = null;
let wasmMemory = null; // the wasm instance's WebAssembly.Memory, once initialised
const aborted = new Set(); // page ids aborted before their request reached the engine
let lastLoad = null; // {model, engineOptions, sha256, persist} of the loaded model, to reload it after a device loss
let recovery = null; // the reload under way after a device loss; requests wait for it
let encoding = Promise.resolve(); // the embedding or rerank call under way; the next waits for it
let prefixes = null; // the PrefixStore of the loaded model, with `persistPrefix`
let saving = Promise.resolve(); // the KV prefix being saved after a request; the next one waits for it
let remote = null; // the RemoteBackend of a remote engine (createEngine's `remote`)
let batched = false; // the loaded model's requests run as batched steps (info.model.batched)
let crash = null; // the error every call fails with once the engine crashed (`crashWith`)

// The GPUBuffers this worker holds, for `memory()`: created, and neither destroyed nor garbage
// collected. Counted here, where every buffer passes, because wgpu cannot: on the web it drops a
// buffer without destroying it and leaves it to the garbage collector.
const gpuBuffers = { count: 0, bytes: 0 };
if (globalThis.GPUDevice && globalThis.GPUBuffer) {
  const forget = (size) => {
    gpuBuffers.count--;
    gpuBuffers.bytes -= size;
  };
  const collected = new FinalizationRegistry(forget);
  const createBuffer = GPUDevice.prototype.createBuffer;
  GPUDevice.prototype.createBuffer = function (descriptor) {
    const buffer = createBuffer.call(this, descriptor);
    gpuBuffers.count++;
    gpuBuffers.bytes += buffer.size;
    collected.register(buffer, buffer.size, buffer);
    return buffer;
  };
  const destroy = GPUBuffer.prototype.destroy;
  GPUBuffer.prototype.destroy = function () {
    if (collected.unregister(this)) forget(this.size);
    return destroy.call(this);
  };
}

let outbound = (msg) => self.postMessage(msg);
const post = (msg) => outbound(msg);

/** Where the host's messages go (worker.js: its page; shared-worker.js: the client they answer). */
export function setOutbound(send) {
  outbound = send;
}
// An error as the page rebuilds it (a KestrelError): its code, message and what a remote server
// answered.
const errorOf = (e) => ({
  code: (e && e.code) || 'internal',
  message: (e && e.message) || String(e),
  remote: e?.remote,
});

async function initWasm() {
  if (wasmMemory) return;
  wasmMemory = (await init({ module_or_path: new URL('./pkg/kestrel_wasm_bg.wasm', import.meta.url) })).memory;
  // A panic aborts (wasm is built with panic=abort) with a bare `RuntimeError: unreachable`: its
  // message, reported just before, says why.
  reportPanicsTo((message) => crashWith('RuntimeError: unreachable', message));
}

/**
 * A generation request's JSON for the engine core, which checks every option. JSON has no NaN or
 * Infinity (`JSON.stringify` writes null, which would mean "the default"), so a non-finite number
 * goes as its name, a string the engine refuses naming the option and its range; a `logit_bias`
 * of -Infinity goes as null, which bans the token as -Infinity does.
 * @param {Record<string, unknown>} body
 */
function requestJson(body) {
  return JSON.stringify(body, function (key, value) {
    if (typeof value !== 'number' || Number.isFinite(value)) return value;
    return this === body.logit_bias && value === -Infinity ? null : String(value);
  });
}

/**
 * Whether `e` is a trap of the wasm instance: a `RuntimeError` (a panic or an allocation failure,
 * which abort: `unreachable`; a bad memory access), or a stack overflow (a RangeError in V8 and
 * JavaScriptCore, an InternalError in Firefox).
 */
function isTrap(e) {
  return e instanceof WebAssembly.RuntimeError
    || (e instanceof RangeError && /call stack/i.test(e.message))
    || (e?.name === 'InternalError' && /recursion/i.test(e.message));
}

/**
 * Records the engine's crash, once, and tells every client ('crashed'). After a trap the
 * instance's Rust state is undefined (RefCells left borrowed, structures half written), and
 * wasm-bindgen instantiates its module once per realm: nothing here can run the engine again, so
 * every call fails with the crash's error and the page replaces this worker with a new one that
 * reloads the model (index.js). `trap`: what the instance threw; `panic`: the panic behind it.
 * @param {string} trap
 * @param {string} [panic]
 */
function crashWith(trap, panic) {
  if (!crash) {
    crash = fail('internal', `the engine crashed (${trap}${panic ? `: ${panic}` : ''}); it restarts in a new worker and reloads the model`);
    post({ type: 'status', status: 'crashed', error: errorOf(crash) });
  }
  return crash;
}

/**
 * The error a call fails with: `e`, or the crash's once the engine crashed (`e` may then be what
 * a later use of the dead instance threw, such as wasm-bindgen's "recursive use of an object").
 */
function callError(e) {
  if (crash) return crash;
  return isTrap(e) ? crashWith(`${e.name}: ${e.message}`) : e;
}

// A trap in a future that the wasm polls from a microtask (a step, a load's compile, an
// embedding) reaches no call: its promise never settles, and the trap is this worker's uncaught
// error, kept here from the page's `onerror` (which would close the engine for good). After a
// crash, so are the dead instance's other errors.
self.addEventListener('error', (event) => {
  if (!crash && !isTrap(event.error)) return;
  event.preventDefault();
  callError(event.error);
});
self.addEventListener('unhandledrejection', (event) => {
  if (!crash && !isTrap(event.reason)) return;
  event.preventDefault();
  callError(event.reason);
});

async function getEngine(engineOptions) {
  if (!engine) {
    await initWasm();
    engine = await Engine.create(JSON.stringify(await withSubmitBudget(engineOptions)));
  }
  return engine;
}

// The display's frame interval, measured from requestAnimationFrame as the worker starts (where
// the browser offers it to workers, and the page is visible), else that of 60 Hz.
const frameInterval = measureFrameInterval();

function measureFrameInterval() {
  const fallback = 1000 / 60;
  if (typeof self.requestAnimationFrame !== 'function') return Promise.resolve(fallback);
  return new Promise((resolve) => {
    const stamps = [];
    const timer = setTimeout(() => resolve(fallback), 500);
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
 */
async function withSubmitBudget(engineOptions) {
  if (engineOptions?.submit_budget_ms != null) return engineOptions;
  return { ...engineOptions, submit_budget_ms: (await frameInterval) / 2 };
}

/** Moves the engine to the CPU backend (with `backend` 'auto', for a model the GPU cannot hold). */
async function cpuEngine(engineOptions, reason) {
  engine?.free();
  engine = await Engine.create(JSON.stringify({ ...engineOptions, backend: 'cpu', backend_reason: reason }));
  return engine;
}

const fail = (code, message) => Object.assign(new Error(message), { code });

/**
 * The error for a URL that answered with something other than a model file, judged from the
 * response alone before its bytes are read: an error status, or a web page or JSON where a dev
 * server answers a path it does not have with its index.html, or a model hub's page of the file
 * was given instead of its download link. Null for a response that may be the file.
 */
function notAModel(response, url) {
  const type = response.headers.get('content-type') ?? '';
  const kind = /^\s*(text\/html|application\/xhtml)/i.test(type) ? 'an HTML page' : /json/i.test(type) ? 'JSON' : null;
  if (!response.ok) {
    return fail('fetch_failed', `could not fetch ${url}: HTTP ${response.status}${type ? ` (${kind ?? type})` : ''}`);
  }
  if (!kind) return null;
  return fail('bad_model', `${url} is not a GGUF file: the server answered with ${kind} (Content-Type: ${type}). `
    + 'Check the model URL: a dev server answers a path it does not have with its index.html, and a model hub '
    + 'serves the file itself only from its download link (on Hugging Face, /resolve/ rather than /blob/).');
}

/**
 * The files of `model`: a URL's (every shard's, where it names a split model's first shard:
 * `…-00001-of-00003.gguf`), a Blob's, or an array of Blobs, a split model's shards (Files in the
 * order of their names, which is the shards' order).
 */
async function modelFiles(model) {
  await initWasm();
  if (typeof model === 'string') return shardNames(model) ?? [model];
  if (model instanceof Blob) return [model];
  if (Array.isArray(model) && model.length > 0 && model.every((m) => m instanceof Blob)) {
    if (!model.every((m) => m instanceof File)) return [...model];
    return [...model].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }
  throw fail('invalid_option', "model must be a URL string, a Blob or a File, or an array of a split model's shards (Blobs or Files)");
}

/**
 * Reads the GGUF header of `model` (a URL or a Blob) into `probe` and no more: HTTP range
 * requests of growing size, or, where the server ignores ranges, the start of the body until the
 * header is complete.
 */
async function readHeader(model, probe) {
  const truncated = () => fail('bad_model', 'bad model file: the file ends inside its header');
  if (model instanceof Blob) {
    for (let at = 0, size = 1 << 20; ; at += size, size *= 2) {
      if (at >= model.size) throw truncated();
      if (probe.push(new Uint8Array(await model.slice(at, at + size).arrayBuffer()))) return;
    }
  }
  for (let at = 0, size = 1 << 20; ; at += size, size *= 2) {
    let response;
    try {
      response = await fetch(model, { headers: { Range: `bytes=${at}-${at + size - 1}` } });
    } catch (e) {
      throw fail('fetch_failed', `could not fetch ${model}: ${e.message}`);
    }
    if (response.status === 416) throw truncated();
    const wrong = notAModel(response, model);
    if (wrong) throw wrong;
    if (!response.body) throw fail('fetch_failed', `could not fetch ${model}: HTTP ${response.status} without a body`);
    if (response.status === 206) {
      const bytes = new Uint8Array(await response.arrayBuffer());
      if (probe.push(bytes)) return;
      if (bytes.byteLength < size) throw truncated();
      continue;
    }
    // The whole file is coming: read its start, then stop the download.
    if (at > 0) probe.restart();
    const reader = response.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) throw truncated();
      if (probe.push(value)) {
        reader.cancel().catch(() => {});
        return;
      }
    }
  }
}

/**
 * The adapter whose limits and description the worker reports (wgpu requests its own to create the
 * device): asked once and kept, as it describes the same GPU for the worker's lifetime; a failed
 * request is asked again next time.
 * @type {Promise<GPUAdapter | null> | null}
 */
let adapterRequest = null;
function describedAdapter() {
  adapterRequest ??= (navigator.gpu?.requestAdapter({ powerPreference: 'high-performance' }) ?? Promise.resolve(null)).catch(() => null).then((a) => {
    if (!a) adapterRequest = null;
    return a;
  });
  return adapterRequest;
}

/**
 * Will `model` fit this browser with `slots` (absent: 1) `contextLength`-token KV caches of
 * `kvCache` values ('f16' or 'f32'; absent: f16): the estimate from its header; the GPU verdict
 * against the adapter's limits and the memory a GPU here can plausibly hold (`memory_limit`, from
 * `navigator.deviceMemory`); the CPU backend's (`cpu`) against 32-bit wasm memory. With `gpu`
 * false, no adapter is asked for and the GPU verdict is left null (`fits`).
 */
async function estimate(model, contextLength, kvCache, slots, { gpu = true } = {}) {
  const files = await modelFiles(typeof model === 'string' ? new URL(model, self.location.href).href : model);
  const probe = new HeaderProbe();
  try {
    // A split model's shards' headers, one after another: the estimate is the whole model's.
    for (const [k, file] of files.entries()) {
      if (k > 0) probe.nextShard();
      await readHeader(file, probe);
    }
    const adapter = gpu ? await describedAdapter() : null;
    const limits = adapter ? { maxBufferSize: adapter.limits.maxBufferSize, maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize } : null;
    // GiB, rounded down and capped at 8 (Chrome's workers have it; other browsers none).
    const deviceMemory = typeof navigator.deviceMemory === 'number' ? navigator.deviceMemory : undefined;
    const options = JSON.stringify({ context_length: contextLength, kv_cache: kvCache, slots });
    const result = probe.estimate(options, limits?.maxBufferSize, limits?.maxStorageBufferBindingSize, deviceMemory);
    result.limits = limits;
    if (gpu && !adapter) Object.assign(result, { fits: false, code: 'no_webgpu', reason: 'WebGPU is not available here (no adapter)' });
    return result;
  } finally {
    probe.free();
  }
}

/**
 * The engine to load `model` (a URL, a Blob, or a split model's shards) on, judged from its
 * header before any weight is read, and the model's size from it (`file_bytes`). On WebGPU: the GPU where the model fits it (every binding, and the total within what the
 * GPU can plausibly hold); with backend 'auto', otherwise the CPU backend where the model fits
 * 32-bit wasm memory. On the CPU backend ('cpu', or 'auto' without a usable GPU): the engine
 * where the model fits wasm memory. Otherwise fails with the verdict's code and numbers:
 * `device_limits` (which a `remote` server takes over) or `unsupported_quant`.
 */
async function fittingEngine(model, eng, engineOptions) {
  const onGpu = eng.backend() === 'webgpu';
  const fits = await estimate(model, engineOptions?.context_length, engineOptions?.kv_cache, engineOptions?.slots, { gpu: onGpu });
  const { cpu } = fits;
  const fitting = (e) => ({ eng: e, fileBytes: fits.file_bytes });
  if (!onGpu) {
    if (!cpu.fits) throw fail(cpu.code, `the model does not fit this device: ${cpu.reason}`);
    return fitting(eng);
  }
  if (fits.fits !== false) return fitting(eng);
  if ((engineOptions?.backend ?? 'auto') !== 'auto' || fits.code === 'unsupported_quant') {
    throw fail(fits.code, `the model does not fit this device: ${fits.reason}`);
  }
  if (!cpu.fits) throw fail(cpu.code, `the model fits neither the GPU (${fits.reason}) nor the CPU backend (${cpu.reason})`);
  return fitting(await cpuEngine(engineOptions, `the model does not fit the GPU: ${fits.reason}`));
}

/** Adds the browser's own adapter description (wgpu's name is often empty on the web). */
async function describeAdapter(info) {
  const i = (await describedAdapter())?.info;
  if (!info.gpu || !i) return;
  info.gpu.adapter_info = { vendor: i.vendor, architecture: i.architecture, device: i.device, description: i.description };
  if (!info.gpu.adapter) info.gpu.adapter = adapterName(i);
}

const quotaExceeded = (bytes) => ({
  code: 'quota_exceeded',
  message: `the model (${bytes ? `${(bytes / 1e6).toFixed(1)} MB` : 'its size unknown'}) does not fit this site's storage quota, so it is not cached and will be downloaded again next time`,
});

/**
 * Streams `model` (a URL string, a Blob or a File, or an array of a split model's shards; a URL
 * that names a split model's first shard brings the others) into the engine, with progress
 * events. With `persist` (`{maxBytes}`), opens the store of saved KV prefixes under the file's
 * sha256 (a split model's: of its shards' digests).
 */
async function load(id, model, useCache, engineOptions, sha256, persist) {
  let eng = await getEngine(engineOptions);
  prefixes = null;
  const files = await modelFiles(model);
  const shards = files.length;
  const expected = sha256 == null ? null : [sha256].flat();
  if (expected && expected.length !== shards) {
    throw fail('invalid_option', `invalid option sha256: one digest per file of the model (${shards}), not ${expected.length}`);
  }
  const ofShard = (k) => (shards > 1 ? ` (shard ${k + 1} of ${shards})` : '');
  // The digests check the files against `sha256`, and key the model's saved KV prefixes.
  const digests = expected || persist ? [] : null;
  let phase = 'upload';
  let total = 0;
  let cache = null;
  // Per file: the Cache API's copy (a URL's, from an earlier load), and the copy being stored.
  let hits = files.map(() => null);
  const cachePuts = files.map(() => null);
  // Whether the Cache API keeps the files, and why not where it could not (`info.model_cache`).
  let cacheError = null;
  // Per file downloaded now: its Content-Length (0 where the host sent none).
  const lengths = files.map(() => 0);
  if (typeof files[0] === 'string') {
    cache = useCache && self.caches ? await caches.open(CACHE_NAME) : null;
    if (cache) hits = await Promise.all(files.map(async (url) => (await cache.match(url)) ?? null));
    if (hits.every(Boolean)) {
      phase = 'cache';
      total = hits.reduce((sum, hit) => sum + (Number(hit.headers.get('content-length')) || 0), 0);
    } else {
      // Before downloading gigabytes, check from the headers alone that the model fits the GPU,
      // or with backend 'auto' the CPU backend where the GPU cannot hold it, or on the CPU
      // backend wasm memory.
      let fileBytes;
      ({ eng, fileBytes } = await fittingEngine(model, eng, engineOptions));
      phase = 'download';
      // A split model's size from its headers; one file's from its Content-Length below.
      if (shards > 1) total = fileBytes;
    }
  } else {
    // The same check from the files' headers, before streaming gigabytes into the engine.
    ({ eng } = await fittingEngine(model, eng, engineOptions));
    total = files.reduce((sum, blob) => sum + blob.size, 0);
  }

  /** The body of file `k`, downloading it (and storing a copy in the Cache API) where needed. */
  const open = async (k) => {
    const file = files[k];
    if (file instanceof Blob) return file.stream();
    if (hits[k]) return hits[k].body;
    let response;
    try {
      response = await fetch(file);
    } catch (e) {
      throw fail('fetch_failed', `could not fetch ${file}: ${e.message}`);
    }
    const wrong = notAModel(response, file);
    if (wrong) throw wrong;
    if (!response.body) throw fail('fetch_failed', `could not fetch ${file}: HTTP ${response.status} without a body`);
    const length = Number(response.headers.get('content-length')) || 0;
    lengths[k] = length;
    if (shards === 1) total = length;
    let body = response.body;
    if (cache && length > (await storageRoom())) {
      cacheError = quotaExceeded(shards > 1 ? total : length);
      cache = null;
    }
    if (cache) {
      // One branch feeds the engine, the other the Cache API (committed only when complete),
      // each shard marked with the model it belongs to (the first shard's URL).
      const [mine, cached] = body.tee();
      body = mine;
      const headers = new Headers(response.headers);
      if (shards > 1) headers.set(SHARD_HEADER, `${k + 1}/${shards} ${files[0]}`);
      cachePuts[k] = cache.put(file, new Response(cached, { headers })).catch((e) => e);
    }
    return body;
  };

  let reader = null;
  let loaded = 0;
  let lastReport = 0;
  let progress = null;
  // A split model's shard being read (from 1).
  let shard = 0;
  const report = () => post({
    type: 'progress',
    id,
    progress: {
      phase, loaded, total, tensors: progress?.tensors_loaded ?? 0, tensorsTotal: progress?.tensors_total ?? 0, ...(shards > 1 ? { shard, shards } : {}),
    },
  });
  try {
    for (let k = 0; k < shards; k++) {
      if (k > 0) eng.loadNextShard();
      shard = k + 1;
      reader = (await open(k)).getReader();
      // Each shard's start is reported, however soon the last report was.
      if (shards > 1) report();
      const hasher = digests ? new Sha256Hasher() : null;
      // A download (not a File, a Blob or the Cache API's copy) can be cut short.
      const downloading = typeof files[k] === 'string' && !hits[k];
      let fileLoaded = 0;
      for (;;) {
        const { done, value } = await reader.read().catch((e) => {
          throw downloading ? cutShort(files[k], fileLoaded, lengths[k], e) : e;
        });
        if (done) break;
        fileLoaded += value.byteLength;
        loaded += value.byteLength;
        hasher?.update(value);
        progress = eng.loadChunk(value);
        // Without a Content-Length (a host compressing on the fly) the header gives the size.
        if (!total && progress.file_bytes) total = progress.file_bytes;
        const now = performance.now();
        if (now - lastReport > 50) {
          lastReport = now;
          report();
        }
      }
      reader = null;
      // A stream that ends before the size its host or the file's header declared is a download
      // cut short (a host or proxy compressing on the fly, a dropped connection), not a bad file.
      const declared = lengths[k] || (shards === 1 ? progress?.file_bytes ?? 0 : 0);
      if (downloading && fileLoaded < declared) throw cutShort(files[k], fileLoaded, declared);
      if (hasher) {
        const digest = hasher.finishHex();
        hasher.free();
        digests.push(digest);
        // Checked before the model is built; a mismatch also drops the copy the Cache API got.
        if (expected && digest !== expected[k].toLowerCase()) {
          throw fail('bad_model', `bad model file${ofShard(k)}: its sha256 is ${digest}, not the expected ${expected[k]}`);
        }
      }
    }
    // A split model's total from its headers leaves out its later shards' headers.
    total = Math.max(total, loaded);
    report();
    post({ type: 'progress', id, progress: { phase: 'compile', loaded, total } });
    const info = await eng.finishLoad();
    await describeAdapter(info);
    // Whether `persistPrefix` works here, and why not (engine.info.persist_prefix).
    let persistOff = null;
    if (persist && info.backend === 'cpu') {
      persistOff = 'the CPU backend keeps no KV prefix snapshots (they are copies of GPU buffers)';
    } else if (persist) {
      // Keyed by the file and the cache's value type: an f32 engine's snapshots neither serve nor
      // supersede an f16 one's.
      prefixes = await PrefixStore.open(`${modelDigest(digests)}:${engineOptions?.kv_cache ?? 'f16'}`, persist.maxBytes).catch((e) => {
        persistOff = `the Origin Private File System is not available: ${e?.message ?? e}`;
        return null;
      });
    }
    if (persistOff) console.warn(`kestrel: persistPrefix is off: ${persistOff}`);
    info.persist_prefix = persist ? { enabled: !persistOff, reason: persistOff } : null;
    for (const put of cachePuts) {
      const err = put && (await put);
      if (err instanceof Error && !cacheError) {
        cacheError = err.name === 'QuotaExceededError' ? quotaExceeded(total) : { code: 'cache_failed', message: `could not store the model in the Cache API: ${err.message}` };
      }
    }
    // The model runs from the network either way; the page learns why it will download it again.
    if (cacheError) console.warn(`kestrel: ${cacheError.message}`);
    const stored = typeof files[0] === 'string' && files.every((_, k) => hits[k] || cachePuts[k]) && !cacheError;
    info.model_cache = { stored, error: cacheError };
    batched = info.model?.batched === true;
    post({ type: 'progress', id, progress: { phase: 'ready', loaded, total } });
    return info;
  } catch (e) {
    // A trap (an allocation failure, most likely here) left the engine unusable: no more calls.
    if (isTrap(e)) throw e;
    reader?.cancel().catch(() => {});
    eng.cancelLoad();
    // Never keep a file that failed to load (a corrupt download would otherwise stick), nor the
    // other shards of its model.
    if (cache && typeof files[0] === 'string') {
      await Promise.all(cachePuts.filter(Boolean));
      await Promise.all(files.map((url) => cache.delete(url)));
    }
    throw e;
  }
}

/**
 * The error of a download that ended, or failed, after `received` of the `expected` bytes
 * (0: unknown): `fetch_failed`, naming both, and `retryable` (handleMessage fetches it again once).
 * @param {string} url
 * @param {number} received
 * @param {number} expected
 * @param {Error} [cause] the stream's error, where it failed rather than ended
 */
function cutShort(url, received, expected, cause) {
  const of = expected ? ` of ${expected}` : '';
  const why = cause ? `: ${cause.message}` : '';
  return Object.assign(fail('fetch_failed', `the download of ${url} ended after ${received}${of} bytes${why}; no copy of it was kept`), { retryable: true });
}

/** The digest that names a model: its file's sha256, or a split model's: of its shards' digests. */
function modelDigest(digests) {
  if (digests.length === 1) return digests[0];
  const hasher = new Sha256Hasher();
  hasher.update(new TextEncoder().encode(digests.join('\n')));
  const digest = hasher.finishHex();
  hasher.free();
  return digest;
}

/**
 * With `persistPrefix`: before submitted request `rid` starts, restores the rows of the saved KV
 * prefix that shares the most tokens with its prompt, where that beats what the cache holds by
 * enough to pay for reading it. A corrupt snapshot is deleted; one of another setup (context,
 * cache type) is left for it. Any failure here only means the request prefills more.
 */
async function restorePrefix(eng, rid) {
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
    console.warn('kestrel: a saved KV prefix was not restored:', e?.message ?? e);
    if (e?.code === 'bad_snapshot' && entry) await prefixes.remove(entry.name);
    if (e?.code === 'snapshot_mismatch' && entry) prefixes.refused.add(entry.name);
  }
}

/**
 * With `persistPrefix`: saves the cached prefix after a request, as much of it as the byte budget
 * and the storage quota allow (a failure loses only the save).
 */
async function savePrefix(eng) {
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
    console.warn('kestrel: could not save the KV prefix:', e?.message ?? e);
  }
}

/** Engine request id -> the page's request: {id, resolve, reject}. */
const requests = new Map();
/** Page id -> engine request id, while the request runs (for its abort). */
const engineIds = new Map();
/** The stepping loop while it runs. */
let stepping = null;

/**
 * Submits a generation (`body`: the page's OpenAI-shaped request for `endpoint`) to the engine
 * core and resolves to its answer: the whole completion, or null once a stream's chunks are all
 * posted. With `persistPrefix` (one request at a time), a saved KV prefix is restored before it
 * starts.
 */
async function generate(id, endpoint, body) {
  const eng = engine;
  if (!eng) throw fail('no_model', 'no model is loaded');
  const rid = eng.submit(endpoint, requestJson(body));
  engineIds.set(id, rid);
  // An abort that came before the request.
  if (aborted.delete(id)) eng.abort(rid);
  // One request at a time (persistPrefix's setting): nothing runs, the cache is free to restore.
  if (prefixes && !batched) await restorePrefix(eng, rid);
  const answer = new Promise((resolve, reject) => requests.set(rid, { id, resolve, reject }));
  stepping ??= step(eng).finally(() => {
    stepping = null;
  });
  try {
    return await answer;
  } finally {
    engineIds.delete(id);
  }
}

/**
 * Steps the engine while it has requests, yielding to the worker's event loop between steps so
 * that new requests join and aborts arrive. A step that fails as a whole (the model unloaded)
 * ends every request with its error.
 */
async function step(eng) {
  while (eng.hasWork()) {
    try {
      await eng.step(onEngineEvent);
    } catch (e) {
      for (const r of requests.values()) r.reject(e);
      requests.clear();
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
}

/** One event of the engine core: a streamed chunk, a request's end or its error. */
function onEngineEvent(event) {
  const r = requests.get(event.id);
  if (!r) return;
  if (event.chunk) {
    post({ type: 'token', id: r.id, chunk: event.chunk });
    return;
  }
  requests.delete(event.id);
  if (event.error) {
    settleError(r, fail(event.error.code, event.error.message));
    return;
  }
  r.resolve(event.result);
  // Saved after the answer, once the step ends; the next request waits for it.
  if (prefixes && !batched) saving = saving.then(() => stepping).then(() => savePrefix(engine));
}

/** Rejects `r` with `error`, or with the device loss behind a GPU error, recovering from it. */
async function settleError(r, error) {
  r.reject(await deviceFault(error));
}

/**
 * The error a request fails with: `error`, or the device loss behind a GPU error. After a loss
 * the engine recovers by itself for the next request.
 */
async function deviceFault(error) {
  const e = error?.code === 'gpu' && engine ? await lossBehind(engine, error) : error;
  if (e?.code === 'device_lost' && lastLoad && !recovery) recovery = recover();
  return e;
}

/**
 * A remote engine's generation: checked as a local engine would check it, sent to the server,
 * and its answer written by the same engine core as a local one's.
 */
async function generateRemote(id, endpoint, body) {
  await initWasm();
  const answer = new RemoteAnswer(id, endpoint, requestJson(body), remote.model);
  try {
    const onToken = (text, tokenId, logprobs) => {
      for (const e of answer.token(text, tokenId, logprobs ? JSON.stringify(logprobs) : undefined)) post({ type: 'token', id, chunk: e.chunk });
    };
    // An abort that came before the request.
    const result = await remote.generate(id, endpoint, body, onToken, aborted.delete(id));
    let value = null;
    for (const e of answer.done(JSON.stringify(result), result.completion_tokens)) {
      if (e.chunk) post({ type: 'token', id, chunk: e.chunk });
      else value = e.result;
    }
    return value;
  } finally {
    answer.free();
  }
}

/**
 * Embeds the inputs of `body` (`embeddings.create`'s argument without `signal`, type 'embed') or
 * scores its documents against its query (`rerank`'s, type 'rerank') on the loaded model, on the
 * GPU or the CPU kernels: the answer's JSON. A pass runs to its end once started (the page stops
 * waiting for an aborted call's answer, and sends no abort for it). A lost device fails the call
 * with `device_lost`, and the engine recovers for the next.
 * @param {'embed' | 'rerank'} type
 */
async function encode(type, body) {
  if (!engine) throw fail('no_model', 'no model is loaded');
  try {
    return await (type === 'embed' ? engine.embed(JSON.stringify(body)) : engine.rerank(JSON.stringify(body)));
  } catch (e) {
    throw await deviceFault(e);
  }
}

/**
 * A remote engine's embeddings or rerank: checked as a local engine would check them, then sent
 * to the server's /embeddings or /rerank; null when aborted (the page has stopped waiting).
 * @param {'embed' | 'rerank'} type
 */
async function encodeRemote(type, id, body) {
  await initWasm();
  (type === 'embed' ? checkEmbeddingRequest : checkRerankRequest)(JSON.stringify(body));
  return type === 'embed' ? remote.embed(id, body, aborted.delete(id)) : remote.rerank(id, body, aborted.delete(id));
}

/**
 * The browser reports a lost device after the errors the loss causes (a destroyed buffer used in a
 * submit): after a `gpu` error, waits briefly for a loss and returns it, else the error itself.
 */
async function lossBehind(eng, error) {
  for (let i = 0; i < 10; i++) {
    await new Promise((r) => setTimeout(r, 50));
    try {
      eng.checkDevice();
    } catch (fault) {
      if (fault?.code === 'device_lost' || isTrap(fault)) return fault;
    }
  }
  return error;
}

/**
 * After a device loss: a new device, and the model reloaded (from the Cache API for a URL, else
 * from the same File or Blob). Reports each stage as a 'status' message.
 */
async function recover() {
  const { model, engineOptions, sha256, persist } = lastLoad;
  post({ type: 'status', status: 'device_lost' });
  // The browser may offer another adapter after a loss.
  adapterRequest = null;
  engine?.unload();
  engine?.free();
  engine = null;
  try {
    post({ type: 'status', status: 'reloading' });
    const info = await load(0, model, true, engineOptions, sha256, persist);
    post({ type: 'status', status: 'ready', info });
  } catch (e) {
    lastLoad = null;
    post({ type: 'status', status: 'failed', error: errorOf(callError(e)) });
  } finally {
    recovery = null;
  }
}

/** Posts the answer of a generation message. */
async function answer(id, run) {
  try {
    post({ type: 'result', id, value: await run() });
  } catch (e) {
    post({ type: 'error', id, error: errorOf(callError(e)) });
  }
}

/** Handles one message of a client: a request, or the abort of one. */
export async function handleMessage(data) {
  const { type, id } = data;
  if (crash) {
    // The page replaces this worker; until it does, every call fails with the crash.
    if (type !== 'abort') post({ type: 'error', id, error: errorOf(crash) });
    return;
  }
  if (type === 'abort') {
    if (remote?.isRunning(id)) remote.abort(id);
    else if (engineIds.has(id)) engine?.abort(engineIds.get(id));
    else aborted.add(id);
    return;
  }
  if (type === 'generate' && remote) {
    answer(id, () => generateRemote(id, data.endpoint, data.body));
    return;
  }
  if ((type === 'embed' || type === 'rerank') && remote) {
    answer(id, () => encodeRemote(type, id, data.body));
    return;
  }
  if (type === 'generate' && batched) {
    // Batched: joins the running steps instead of waiting for the requests before it.
    answer(id, () => generate(id, data.endpoint, data.body));
    return;
  }
  try {
    if (recovery && type !== 'estimate') await recovery;
    if (type !== 'estimate' && type !== 'destroy-device') await saving;
    let value;
    switch (type) {
      case 'load':
        await stepping;
        await encoding;
        value = await load(id, data.model, data.cache !== false, data.options, data.sha256, data.persist).catch((e) => {
          // A download cut short is fetched again once, from the start: hosts that compress on
          // the fly answer no Range to resume from.
          if (!e?.retryable) throw e;
          console.warn(`kestrel: ${e.message}; downloading it again`);
          return load(id, data.model, data.cache !== false, data.options, data.sha256, data.persist);
        });
        lastLoad = { model: data.model, engineOptions: data.options, sha256: data.sha256, persist: data.persist };
        break;
      case 'connect':
        // A remote engine: its requests go to this OpenAI-compatible server.
        remote = new RemoteBackend(data.remote);
        await initWasm();
        break;
      case 'destroy-device':
        // The test hook of the recovery: loses the device as a driver reset would.
        engine?.destroyDevice();
        break;
      case 'trap':
        // The test hook of the crash recovery: traps the instance, `how` as `trapForTest` says.
        // Only the browser suite's build of the wasm (kestrel-wasm's `test-hooks`) has it.
        if (typeof engine?.trapForTest !== 'function') throw fail('invalid_option', 'this build of the engine has no test hooks');
        value = await engine.trapForTest(data.how);
        break;
      case 'generate':
        value = await generate(id, data.endpoint, data.body);
        break;
      case 'embed':
      case 'rerank': {
        // One at a time (the tabs of a shared engine may overlap): a decoder embedding model's
        // KV cache serves one call.
        // One queued behind a call that lost the device waits for the reload.
        const run = encoding.then(async () => {
          if (recovery) await recovery;
          return encode(type, data.body);
        });
        encoding = run.catch(() => {});
        value = await run;
        break;
      }
      case 'reset':
        // After the batched requests before it.
        await stepping;
        engine?.reset();
        break;
      case 'unload': {
        // The requests in flight end with `no_model`.
        const gone = fail('no_model', 'the model was unloaded');
        for (const r of requests.values()) r.reject(gone);
        requests.clear();
        engine?.unload();
        remote?.abortAll();
        lastLoad = null;
        prefixes = null;
        batched = false;
        break;
      }
      case 'estimate':
        value = await estimate(data.model, data.context_length, data.kv_cache, data.slots);
        break;
      case 'flush':
        // Answered once the save after the last request has ended (`await saving` above).
        break;
      case 'memory':
        value = { wasm_bytes: wasmMemory?.buffer.byteLength ?? 0, gpu_buffers: gpuBuffers.count, gpu_buffer_bytes: gpuBuffers.bytes };
        break;
      default:
        throw Object.assign(new Error(`unknown message ${type}`), { code: 'internal' });
    }
    post({ type: 'result', id, value });
  } catch (e) {
    post({ type: 'error', id, error: errorOf(callError(e)) });
  }
}
