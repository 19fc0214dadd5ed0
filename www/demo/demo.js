// The demo chat page: shows the GPU adapter and whether the model fits it, then loads the default
// model (or ?model=URL, or a GGUF file dropped on the page or opened), streams replies, shows speed.
// Query options: model (URL), max_tokens (per reply), context_length (KV cache positions),
// backend ('auto', the default: the CPU path where the GPU is a software one or absent; 'webgpu';
// 'cpu').
import { adapterName as nameOf } from '../adapter-name.js';
import { createEngine, estimate } from '../index.js';
import { renderMarkdown } from './markdown.bundle.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const MODEL = params.get('model') ?? new URL('../../models/SmolLM2-135M-Instruct.Q4_1.gguf', location.href).href;
const MAX_TOKENS = Number(params.get('max_tokens') ?? 512);
const CONTEXT_LENGTH = params.has('context_length') ? Number(params.get('context_length')) : undefined;
const BACKEND = params.get('backend') ?? 'auto';
const messages = [];
let engine = null;
let controller = null;
/** The reply in progress (it never rejects), which a new model waits for before unloading. */
let replying = null;
let loading = false;
/** The adapter as the page sees it, for the header while no model is loaded. */
let adapterName = '';

function showError(e) {
  $('error').hidden = false;
  $('error').textContent = e.code === 'no_webgpu'
    ? 'This browser has no WebGPU (navigator.gpu is missing or no adapter was found). Try a recent Chrome or Edge, or Firefox/Safari with WebGPU enabled.'
    : `${e.message}${e.code ? ` (${e.code})` : ''}`;
}

function bubble(role, text = '') {
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  div.textContent = text;
  $('log').append(div);
  div.scrollIntoView({ block: 'end' });
  return div;
}

const mb = (n) => (n / 1e6).toFixed(1);
/** A byte count shown in MB, the exact count in the <data> element's value. */
function showBytes(id, n) {
  $(id).value = n;
  $(id).textContent = `${mb(n)} MB`;
}

function onProgress({ phase, loaded, total }) {
  const labels = { download: 'Downloading', cache: 'Reading from cache', upload: 'Uploading', compile: 'Compiling kernels', ready: 'Ready' };
  $('phase').textContent = `${labels[phase] ?? phase}${total ? ` ${mb(loaded)} / ${mb(total)} MB` : ''}`;
  $('progress').value = phase === 'compile' || phase === 'ready' ? 1 : total ? loaded / total : 0;
}

/** Enables what the page's state allows: chat with a loaded model, stop while replying. */
function updateControls() {
  const idle = engine != null && !loading && !controller;
  $('input').disabled = engine == null || loading;
  $('send').disabled = !idle;
  $('reset').disabled = !idle;
  $('stop').disabled = !controller;
  $('file').disabled = loading;
}

function clearConversation() {
  messages.length = 0;
  $('log').replaceChildren();
  for (const id of ['ttft', 'toks', 'prefill']) $(id).textContent = '–';
  $('ntok').textContent = '0';
}

/** Shows the page's own WebGPU adapter: its description, features and buffer limits. */
async function showAdapter() {
  const adapter = await navigator.gpu?.requestAdapter({ powerPreference: 'high-performance' }).catch(() => null);
  if (!adapter) return false;
  const { vendor, architecture, device, description } = adapter.info;
  adapterName = nameOf(adapter.info);
  $('adapter').textContent = adapterName;
  $('gpu-summary').textContent = `GPU: ${adapterName} · ${adapter.features.size} features`;
  $('gpu-info').textContent = `vendor ${vendor || '–'} · architecture ${architecture || '–'}${description ? ` · ${description}` : ''}`;
  $('gpu-features').replaceChildren(...[...adapter.features].sort().map((f) => {
    const li = document.createElement('li');
    li.textContent = f;
    return li;
  }));
  showBytes('gpu-max-buffer', adapter.limits.maxBufferSize);
  showBytes('gpu-max-binding', adapter.limits.maxStorageBufferBindingSize);
  $('gpu').hidden = false;
  return true;
}

/** Shows whether `model` fits this GPU, from its header alone (no weights are read). */
async function showEstimate(model, name) {
  $('phase').textContent = `Reading ${name}'s header…`;
  const est = await estimate({ model, context_length: CONTEXT_LENGTH });
  $('est-model').textContent = `${name}, ${est.context_length} tokens of context:`;
  showBytes('est-weights', est.weight_bytes);
  showBytes('est-kv', est.kv_cache_bytes);
  showBytes('est-largest', est.largest_binding.bytes);
  $('est-largest').title = est.largest_binding.name;
  $('est-verdict').textContent = est.fits ? 'fits' : `does not fit: ${est.reason}`;
  $('est-verdict').dataset.fits = est.fits;
  $('estimate').hidden = false;
  return est;
}

/** Loads `model` (a URL or a File) named `name` in place of the current one, if it fits. */
async function load(model, name) {
  loading = true;
  updateControls();
  $('error').hidden = true;
  $('loading').hidden = false;
  $('progress').value = 0;
  document.body.dataset.ready = 'false';
  try {
    const est = await showEstimate(model, name);
    // With 'auto' a model the GPU cannot hold runs on the CPU; a weight type no path runs cannot.
    if (!est.fits && (BACKEND === 'webgpu' || est.code === 'unsupported_quant')) {
      showError({ code: est.code, message: est.reason });
      $('phase').textContent = `${name} does not fit this GPU`;
      return;
    }
    // One model on the GPU at a time: end the reply, then free the current model's memory.
    controller?.abort();
    await replying;
    if (engine) {
      const old = engine;
      engine = null;
      clearConversation();
      $('adapter').textContent = adapterName;
      await old.unload();
    }
    engine = await createEngine({ model, onProgress, backend: BACKEND, context_length: CONTEXT_LENGTH });
    const { info } = engine;
    $('adapter').textContent = info.backend === 'cpu'
      ? `CPU (wasm ${info.cpu.simd}, ${info.cpu.threads} thread${info.cpu.threads === 1 ? '' : 's'}) · ${name}`
      : `${info.gpu.adapter} (${info.gpu.backend}) · ${name}`;
    $('adapter').title = info.backend_reason ?? '';
    $('backend-reason').textContent = info.backend === 'cpu' ? `Running on the CPU: ${info.backend_reason}.` : 'Running on the GPU.';
    $('loading').hidden = true;
    $('input').focus();
  } catch (e) {
    showError(e);
    $('phase').textContent = `Could not load ${name}`;
  } finally {
    loading = false;
    // A model that did not fit leaves the current one loaded and usable.
    document.body.dataset.ready = String(engine != null);
    updateControls();
  }
}

async function send(text) {
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
          $('ttft').textContent = `${((now - start) / 1e3).toFixed(2)} s`;
        } else {
          $('toks').textContent = ((n - 1) / ((now - first) / 1e3)).toFixed(1);
        }
        $('ntok').textContent = n;
      }
      if (chunk.usage) {
        const x = chunk.usage.extra;
        $('ttft').textContent = `${x.time_to_first_token_s.toFixed(2)} s`;
        $('toks').textContent = x.decode_tokens_per_s.toFixed(1);
        $('prefill').textContent = x.prefill_tokens_per_s.toFixed(1);
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

$('form').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('input').value.trim();
  if (!text || !engine || loading || controller) return;
  $('input').value = '';
  replying = send(text);
});
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    $('form').requestSubmit();
  }
});
$('stop').addEventListener('click', () => controller?.abort());
$('reset').addEventListener('click', async () => {
  clearConversation();
  try {
    await engine.reset();
  } catch (e) {
    showError(e);
  }
});

function openFile(file) {
  if (file && !loading) load(file, file.name);
}
$('file').addEventListener('change', () => openFile($('file').files[0]));
// A file dropped anywhere on the page opens it (the file input is the keyboard's way to it).
const carriesFiles = (e) => e.dataTransfer?.types.includes('Files');
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
  openFile(e.dataTransfer.files[0]);
});

if (await showAdapter()) {
  await load(MODEL, decodeURIComponent(new URL(MODEL, location.href).pathname.split('/').pop()));
} else {
  showError({ code: 'no_webgpu' });
  $('phase').textContent = 'No WebGPU';
}
