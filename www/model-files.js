// A model's files as the worker reads them: the shards a URL, a Blob or a list of them names, the
// GGUF header read alone (range requests), and from it whether the model fits this browser
// (`estimate()`, and the check before a load downloads anything).

/**
 * @import { Estimate } from './index.d.ts'
 * @import { ModelInput } from './protocol.d.ts'
 */

import { kestrelError } from './errors.js';
import { HeaderProbe, shardNames } from './wasm.js';

/**
 * The error for a URL that answered with something other than a model file, judged from the
 * response alone before its bytes are read: an error status, or a web page or JSON where a dev
 * server answers a path it does not have with its index.html, or a model hub's page of the file
 * was given instead of its download link. Null for a response that may be the file.
 * @param {Response} response
 * @param {string} url
 */
export function notAModel(response, url) {
  const type = response.headers.get('content-type') ?? '';
  const kind = /^\s*(text\/html|application\/xhtml)/i.test(type) ? 'an HTML page' : /json/i.test(type) ? 'JSON' : null;
  if (!response.ok) {
    return kestrelError('fetch_failed', `could not fetch ${url}: HTTP ${response.status}${type ? ` (${kind ?? type})` : ''}`);
  }
  if (!kind) return null;
  return kestrelError('bad_model', `${url} is not a GGUF file: the server answered with ${kind} (Content-Type: ${type}). `
    + 'Check the model URL: a dev server answers a path it does not have with its index.html, and a model hub '
    + 'serves the file itself only from its download link (on Hugging Face, /resolve/ rather than /blob/).');
}

/**
 * The files of `model`: a URL's (every shard's, where it names a split model's first shard:
 * `…-00001-of-00003.gguf`), a Blob's, or an array of Blobs, a split model's shards (Files in the
 * order of their names, which is the shards' order). The wasm module must be initialised.
 * @param {unknown} model
 * @returns {(string | Blob)[]}
 */
export function modelFiles(model) {
  if (typeof model === 'string') return shardNames(model) ?? [model];
  if (model instanceof Blob) return [model];
  if (Array.isArray(model) && model.length > 0 && model.every((m) => m instanceof Blob)) {
    if (!model.every((m) => m instanceof File)) return [...model];
    return [...model].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }
  throw kestrelError('invalid_option', "model must be a URL string, a Blob or a File, or an array of a split model's shards (Blobs or Files)");
}

/**
 * Reads the GGUF header of `model` (a URL or a Blob) into `probe` and no more: HTTP range
 * requests of growing size, or, where the server ignores ranges, the start of the body until the
 * header is complete.
 * @param {string | Blob} model
 * @param {HeaderProbe} probe
 */
async function readHeader(model, probe) {
  const truncated = () => kestrelError('bad_model', 'bad model file: the file ends inside its header');
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
      throw kestrelError('fetch_failed', `could not fetch ${model}: ${/** @type {Error} */ (e).message}`);
    }
    if (response.status === 416) throw truncated();
    const wrong = notAModel(response, model);
    if (wrong) throw wrong;
    if (!response.body) throw kestrelError('fetch_failed', `could not fetch ${model}: HTTP ${response.status} without a body`);
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
 * The adapter whose limits and description the worker reports (wgpu requests its own to create
 * the device): asked once and kept, as it describes the same GPU for the worker's lifetime; a
 * failed request is asked again next time, and so is one after a device loss (`forget`).
 */
export class DescribedAdapter {
  /** @type {Promise<GPUAdapter | null> | null} */
  #request = null;

  /** @returns {Promise<GPUAdapter | null>} */
  get() {
    this.#request ??= (navigator.gpu?.requestAdapter({ powerPreference: 'high-performance' }) ?? Promise.resolve(null)).catch(() => null).then((a) => {
      if (!a) this.#request = null;
      return a;
    });
    return this.#request;
  }

  forget() {
    this.#request = null;
  }
}

/**
 * The files of `model`, a URL made absolute against the worker's location.
 * @param {ModelInput} model
 */
const filesOf = (model) => modelFiles(typeof model === 'string' ? new URL(model, self.location.href).href : model);

/**
 * Will `model` fit this browser with `slots` (absent: 1) `contextLength`-token KV caches of
 * `kvCache` values ('f16' or 'f32'; absent: f16): the estimate from its header; the GPU verdict
 * against the adapter's limits and the memory a GPU here can plausibly hold (`memory_limit`, from
 * `navigator.deviceMemory`); the CPU backend's (`cpu`) against 32-bit wasm memory, with `draft`
 * (a draft model of speculative decoding, which only the CPU backend runs) beside it where given.
 * With `gpu` false, no adapter is asked for and the GPU verdict is left null (`fits`). The wasm
 * module must be initialised.
 * @param {ModelInput} model
 * @param {{ context_length?: number, kv_cache?: 'f16' | 'f32', slots?: number }} options
 * @param {DescribedAdapter} adapter
 * @param {{ gpu?: boolean, draft?: ModelInput | null }} [which]
 * @returns {Promise<Estimate>}
 */
export async function estimate(model, { context_length, kv_cache, slots }, adapter, { gpu = true, draft = null } = {}) {
  const files = filesOf(model);
  const draftFiles = draft == null ? [] : filesOf(draft);
  const probe = new HeaderProbe();
  try {
    // A split model's shards' headers, one after another: the estimate is the whole model's;
    // then its draft model's.
    for (const [k, file] of files.entries()) {
      if (k > 0) probe.nextShard();
      await readHeader(file, probe);
    }
    for (const [k, file] of draftFiles.entries()) {
      if (k === 0) probe.startDraft();
      else probe.nextShard();
      await readHeader(file, probe);
    }
    const found = gpu ? await adapter.get() : null;
    const limits = found ? { maxBufferSize: found.limits.maxBufferSize, maxStorageBufferBindingSize: found.limits.maxStorageBufferBindingSize } : null;
    // GiB, rounded down and capped at 8 (Chrome's workers have it; other browsers none, and so
    // has TypeScript's lib).
    const { deviceMemory } = /** @type {{ deviceMemory?: unknown }} */ (navigator);
    const options = JSON.stringify({ context_length, kv_cache, slots });
    const result = { ...probe.estimate(options, limits?.maxBufferSize, limits?.maxStorageBufferBindingSize, typeof deviceMemory === 'number' ? deviceMemory : undefined), limits };
    if (gpu && !found) Object.assign(result, { fits: false, code: 'no_webgpu', reason: 'WebGPU is not available here (no adapter)' });
    return result;
  } finally {
    probe.free();
  }
}
