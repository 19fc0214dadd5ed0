// The demo chat page: shows the GPU adapter and whether the model fits it, then loads the default
// model (or ?model=URL, or a GGUF file dropped on the page or opened), streams replies, shows speed.
// Query options: model (URL), max_tokens (per reply), context_length (KV cache positions),
// backend ('auto', the default: the CPU path where the GPU is a software one or absent; 'webgpu';
// 'cpu').
import { adapterName as nameOf } from '../adapter-name.js';
import { createEngine, estimate } from '../index.js';
import { renderMarkdown } from './markdown.bundle.js';

/**
 * @import { ChatMessage, CreateEngineOptions, Engine, Estimate, LoadProgress } from '../index.d.ts'
 */

/**
 * The page's element `id` (index.html has every one the script names), checked to be a `type`
 * (HTMLElement where absent): a missing or different element is an error that names it.
 * @template {HTMLElement} [T=HTMLElement]
 * @param {string} id
 * @param {{ new (): T }} [type]
 * @returns {T}
 */
function byId(id, type) {
  const element = document.getElementById(id);
  const expected = type ?? HTMLElement;
  if (!(element instanceof expected)) throw new Error(`the demo page has no ${expected.name} #${id}`);
  // An instance of `type`, or with no `type` of HTMLElement, which is then T (its default).
  return /** @type {T} */ (element);
}

const params = new URLSearchParams(location.search);
const MODEL = params.get('model') ?? new URL('../../models/SmolLM2-135M-Instruct.Q4_1.gguf', location.href).href;
const MAX_TOKENS = Number(params.get('max_tokens') ?? 512);
const CONTEXT_LENGTH = params.has('context_length') ? Number(params.get('context_length')) : undefined;
// A name createEngine does not know is its to reject: the page shows that error.
const BACKEND = /** @type {CreateEngineOptions['backend']} */ (params.get('backend') ?? 'auto');
/** @type {ChatMessage[]} */
const messages = [];
/** @type {Engine | null} */
let engine = null;
/** @type {AbortController | null} */
let controller = null;
/** The reply in progress (it never rejects), which a new model waits for before unloading. */
/** @type {Promise<void> | null} */
let replying = null;
let loading = false;
/** The adapter as the page sees it, for the header while no model is loaded. */
let adapterName = '';

/**
 * Shows an error: a KestrelError (its message and code), another thrown one, or the page's own.
 * @param {unknown} e
 */
function showError(e) {
  // Whatever was thrown: its code and message where it has them (read as the page always did).
  const { code, message } = /** @type {{ code?: unknown, message?: unknown }} */ (e);
  byId('error').hidden = false;
  byId('error').textContent = code === 'no_webgpu'
    ? 'This browser has no WebGPU (navigator.gpu is missing or no adapter was found). Try a recent Chrome or Edge, or Firefox/Safari with WebGPU enabled.'
    : `${message}${code ? ` (${code})` : ''}`;
}

/**
 * A message bubble in the log, scrolled into view.
 * @param {'user' | 'assistant'} role
 * @param {string} [text]
 */
function bubble(role, text = '') {
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  div.textContent = text;
  byId('log').append(div);
  div.scrollIntoView({ block: 'end' });
  return div;
}

const mb = (/** @type {number} */ n) => (n / 1e6).toFixed(1);
/**
 * A byte count shown in MB, the exact count in the <data> element's value.
 * @param {string} id
 * @param {number} n
 */
function showBytes(id, n) {
  byId(id, HTMLDataElement).value = String(n);
  byId(id).textContent = `${mb(n)} MB`;
}

/** @param {LoadProgress} progress */
function onProgress({ phase, loaded, total }) {
  /** @type {Record<string, string>} */
  const labels = { download: 'Downloading', cache: 'Reading from cache', upload: 'Uploading', compile: 'Compiling kernels', ready: 'Ready' };
  byId('phase').textContent = `${labels[phase] ?? phase}${total ? ` ${mb(loaded)} / ${mb(total)} MB` : ''}`;
  byId('progress', HTMLProgressElement).value = phase === 'compile' || phase === 'ready' ? 1 : total ? loaded / total : 0;
}

/** Enables what the page's state allows: chat with a loaded model, stop while replying. */
function updateControls() {
  const idle = engine != null && !loading && !controller;
  byId('input', HTMLTextAreaElement).disabled = engine == null || loading;
  byId('send', HTMLButtonElement).disabled = !idle;
  byId('reset', HTMLButtonElement).disabled = !idle;
  byId('stop', HTMLButtonElement).disabled = !controller;
  byId('file', HTMLInputElement).disabled = loading;
}

function clearConversation() {
  messages.length = 0;
  byId('log').replaceChildren();
  for (const id of ['ttft', 'toks', 'prefill']) byId(id).textContent = '–';
  byId('ntok').textContent = '0';
}

/** Shows the page's own WebGPU adapter: its description, features and buffer limits. */
async function showAdapter() {
  const adapter = await navigator.gpu?.requestAdapter({ powerPreference: 'high-performance' }).catch(() => null);
  if (!adapter) return false;
  const { vendor, architecture, device, description } = adapter.info;
  adapterName = nameOf(adapter.info);
  byId('adapter').textContent = adapterName;
  byId('gpu-summary').textContent = `GPU: ${adapterName} · ${adapter.features.size} features`;
  byId('gpu-info').textContent = `vendor ${vendor || '–'} · architecture ${architecture || '–'}${description ? ` · ${description}` : ''}`;
  byId('gpu-features').replaceChildren(...[...adapter.features].sort().map((f) => {
    const li = document.createElement('li');
    li.textContent = f;
    return li;
  }));
  showBytes('gpu-max-buffer', adapter.limits.maxBufferSize);
  showBytes('gpu-max-binding', adapter.limits.maxStorageBufferBindingSize);
  byId('gpu').hidden = false;
  return true;
}

/**
 * Shows whether `model` fits this GPU, from its header alone (no weights are read).
 * @param {string | File} model
 * @param {string} name
 * @returns {Promise<Estimate>}
 */
async function showEstimate(model, name) {
  byId('phase').textContent = `Reading ${name}'s header…`;
  const est = await estimate({ model, context_length: CONTEXT_LENGTH });
  byId('est-model').textContent = `${name}, ${est.context_length} tokens of context:`;
  showBytes('est-weights', est.weight_bytes);
  showBytes('est-kv', est.kv_cache_bytes);
  showBytes('est-largest', est.largest_binding.bytes);
  byId('est-largest').title = est.largest_binding.name;
  byId('est-verdict').textContent = est.fits ? 'fits' : `does not fit: ${est.reason}`;
  byId('est-verdict').dataset.fits = String(est.fits);
  byId('estimate').hidden = false;
  return est;
}

/**
 * Loads `model` (a URL or a File) named `name` in place of the current one, if it fits.
 * @param {string | File} model
 * @param {string} name
 */
async function load(model, name) {
  loading = true;
  updateControls();
  byId('error').hidden = true;
  byId('loading').hidden = false;
  byId('progress', HTMLProgressElement).value = 0;
  document.body.dataset.ready = 'false';
  try {
    const est = await showEstimate(model, name);
    // With 'auto' a model the GPU cannot hold runs on the CPU; a weight type no path runs cannot.
    if (!est.fits && (BACKEND === 'webgpu' || est.code === 'unsupported_quant')) {
      showError({ code: est.code, message: est.reason });
      byId('phase').textContent = `${name} does not fit this GPU`;
      return;
    }
    // One model on the GPU at a time: end the reply, then free the current model's memory.
    controller?.abort();
    await replying;
    if (engine) {
      const old = engine;
      engine = null;
      clearConversation();
      byId('adapter').textContent = adapterName;
      await old.unload();
    }
    engine = await createEngine({ model, onProgress, backend: BACKEND, context_length: CONTEXT_LENGTH });
    const { info } = engine;
    byId('adapter').textContent = info.backend === 'cpu'
      ? `CPU (wasm ${info.cpu?.simd}, ${info.cpu?.threads} thread${info.cpu?.threads === 1 ? '' : 's'}) · ${name}`
      : `${info.gpu?.adapter} (${info.gpu?.backend}) · ${name}`;
    byId('adapter').title = info.backend_reason ?? '';
    byId('backend-reason').textContent = info.backend === 'cpu' ? `Running on the CPU: ${info.backend_reason}.` : 'Running on the GPU.';
    byId('loading').hidden = true;
    byId('input').focus();
  } catch (e) {
    showError(e);
    byId('phase').textContent = `Could not load ${name}`;
  } finally {
    loading = false;
    // A model that did not fit leaves the current one loaded and usable.
    document.body.dataset.ready = String(engine != null);
    updateControls();
  }
}

/**
 * Sends `text` to `engine` in the conversation, streaming the reply into a new bubble.
 * @param {Engine} engine
 * @param {string} text
 */
async function send(engine, text) {
  messages.push({ role: 'user', content: text });
  bubble('user', text);
  const out = bubble('assistant');
  out.classList.add('streaming');
  controller = new AbortController();
  updateControls();
  const start = performance.now();
  let first = 0;
  let n = 0;
  let reply = '';
  try {
    const stream = await engine.chat.completions.create({ messages, stream: true, max_tokens: MAX_TOKENS, temperature: 0.7, signal: controller.signal });
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      if (choice?.delta?.content) {
        reply += choice.delta.content;
        // The reply so far as Markdown (an unfinished fence or list renders as it stands).
        out.innerHTML = renderMarkdown(reply);
        out.scrollIntoView({ block: 'end' });
      }
      if (choice?.token_id != null) {
        n++;
        const now = performance.now();
        if (n === 1) {
          first = now;
          byId('ttft').textContent = `${((now - start) / 1e3).toFixed(2)} s`;
        } else {
          byId('toks').textContent = ((n - 1) / ((now - first) / 1e3)).toFixed(1);
        }
        byId('ntok').textContent = String(n);
      }
      if (chunk.usage) {
        const x = chunk.usage.extra;
        byId('ttft').textContent = `${x.time_to_first_token_s.toFixed(2)} s`;
        byId('toks').textContent = x.decode_tokens_per_s.toFixed(1);
        byId('prefill').textContent = x.prefill_tokens_per_s.toFixed(1);
        if (choice?.finish_reason === 'abort') out.dataset.stopped = 'stopped';
      }
    }
    messages.push({ role: 'assistant', content: reply });
  } catch (e) {
    showError(e);
    messages.pop();
  } finally {
    out.classList.remove('streaming');
    controller = null;
    updateControls();
  }
}

byId('form').addEventListener('submit', (e) => {
  e.preventDefault();
  const input = byId('input', HTMLTextAreaElement);
  const text = input.value.trim();
  if (!text || !engine || loading || controller) return;
  input.value = '';
  replying = send(engine, text);
});
byId('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    byId('form', HTMLFormElement).requestSubmit();
  }
});
byId('stop').addEventListener('click', () => controller?.abort());
byId('reset').addEventListener('click', async () => {
  clearConversation();
  try {
    await engine?.reset();
  } catch (e) {
    showError(e);
  }
});

/** @param {File | undefined} file */
function openFile(file) {
  if (file && !loading) load(file, file.name);
}
byId('file').addEventListener('change', () => openFile(byId('file', HTMLInputElement).files?.[0]));
// A file dropped anywhere on the page opens it (the file input is the keyboard's way to it).
const carriesFiles = (/** @type {DragEvent} */ e) => e.dataTransfer?.types.includes('Files');
document.addEventListener('dragover', (e) => {
  if (!carriesFiles(e)) return;
  e.preventDefault(); // accepts the drop
  document.body.classList.add('dragging');
});
document.addEventListener('dragleave', (e) => {
  // relatedTarget is null only when the drag leaves the window, not when it crosses elements.
  if (!e.relatedTarget) document.body.classList.remove('dragging');
});
document.addEventListener('drop', (e) => {
  if (!carriesFiles(e)) return;
  e.preventDefault(); // instead of the browser opening the file
  document.body.classList.remove('dragging');
  openFile(e.dataTransfer?.files[0]);
});

if (await showAdapter()) {
  await load(MODEL, decodeURIComponent(new URL(MODEL, location.href).pathname.split('/').pop() ?? ''));
} else {
  showError({ code: 'no_webgpu' });
  byId('phase').textContent = 'No WebGPU';
}
