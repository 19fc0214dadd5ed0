// The demo chat page: loads the default model (or ?model=URL), streams replies, shows speed.
// Query options: model (URL), max_tokens (per reply), context_length (KV cache positions).
import { createEngine } from '../index.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const MODEL = params.get('model') ?? new URL('../../models/SmolLM2-135M-Instruct.Q4_1.gguf', location.href).href;
const MAX_TOKENS = Number(params.get('max_tokens') ?? 512);
const CONTEXT_LENGTH = params.has('context_length') ? Number(params.get('context_length')) : undefined;
const messages = [];
let engine = null;
let controller = null;

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
function onProgress({ phase, loaded, total }) {
  const labels = { download: 'Downloading', cache: 'Reading from cache', upload: 'Uploading', compile: 'Compiling kernels', ready: 'Ready' };
  $('phase').textContent = `${labels[phase] ?? phase}${total ? ` ${mb(loaded)} / ${mb(total)} MB` : ''}`;
  $('progress').value = phase === 'compile' || phase === 'ready' ? 1 : total ? loaded / total : 0;
}

async function send(text) {
  messages.push({ role: 'user', content: text });
  bubble('user', text);
  const out = bubble('assistant');
  out.classList.add('streaming');
  controller = new AbortController();
  $('send').disabled = true;
  $('stop').disabled = false;
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
        out.textContent = reply;
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
    $('send').disabled = false;
    $('stop').disabled = true;
    controller = null;
  }
}

$('form').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('input').value.trim();
  if (!text || !engine || controller) return;
  $('input').value = '';
  send(text);
});
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    $('form').requestSubmit();
  }
});
$('stop').addEventListener('click', () => controller?.abort());

try {
  engine = await createEngine({ model: MODEL, onProgress, context_length: CONTEXT_LENGTH });
  $('adapter').textContent = `${engine.info.gpu.adapter || 'unnamed adapter'} (${engine.info.gpu.backend}) · ${engine.info.model.name}`;
  $('loading').hidden = true;
  $('input').disabled = false;
  $('send').disabled = false;
  $('input').focus();
  document.body.dataset.ready = 'true';
} catch (e) {
  showError(e);
  $('phase').textContent = 'Could not load the model';
}
