// The run's report: the Markdown table (every engine's row, then Kestrel / peer ratios) and the
// SVG chart (decode and prefill tok/s, inter-token latency p50, per engine), from the run's JSON.
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RESULTS } from './paths.mjs';
import { browserRows, kestrelNativeRows, llamaCppRows } from './rows.mjs';

const fmt = (v, digits = 1) => (v == null || !Number.isFinite(v) ? '–' : v >= 100 ? v.toFixed(0) : v.toFixed(digits));
const gb = (b) => (b == null ? '–' : `${(b / 1e9).toFixed(2)} GB`);
const mib = (b) => (b == null ? '–' : `${(b / 2 ** 20).toFixed(0)} MiB`);
const x = (v) => (v == null || !Number.isFinite(v) ? '–' : `${v >= 10 ? v.toFixed(0) : v >= 0.1 ? v.toFixed(2) : v.toPrecision(2)}×`);
const secs = (ms) => (ms == null ? '–' : ms >= 10_000 ? `${(ms / 1e3).toFixed(0)} s` : `${(ms / 1e3).toFixed(2)} s`);

/** The embeddings part: each round's sentences per second for both engines on the same token ids,
 * and Kestrel over llama.cpp. */
function embeddingLines({ settings: e, rounds }, browser) {
  const lines = [`Embeddings: ${e.model}, ${e.inputs} inputs of ${e.tokens} tokens, ${e.threads} threads (sentences/s, median of ${e.repeats} calls a round):`, '',
    '| round | Kestrel, CPU backend | llama.cpp, embedding context | Kestrel / llama.cpp |', '|--:|--:|--:|--:|'];
  rounds.forEach((r, i) => {
    const k = r.kestrel?.sentences_per_s?.median;
    const l = r.llama_cpp?.sentences_per_s?.median;
    const cell = (v, res) => (res?.error ? `failed: ${res.error}` : fmt(v, 1));
    lines.push(`| ${i + 1} | ${cell(k, r.kestrel)} | ${cell(l, r.llama_cpp)} | ${k && l ? x(k / l) : '–'} |`);
  });
  if (browser) {
    const b = browser.sentences_per_s?.median;
    const native = rounds.map((r) => r.kestrel?.sentences_per_s?.median).filter(Number.isFinite);
    const best = native.length ? Math.max(...native) : null;
    lines.push('', browser.error
      ? `In Chromium: failed: ${browser.error}`
      : `In Chromium (wasm CPU backend, ${browser.cpu?.threads ?? 1} thread, ${browser.cpu?.simd ?? ''}): ${fmt(b, 1)} sentences/s, ${best && b ? x(b / best) : '–'} of the native CPU backend's best round.`);
  }
  lines.push('', 'transformers.js is not in this table: no registry package ships an ONNX copy of the same model, and the bench fetches nothing else.');
  return lines;
}

/** Every row of the run, native first. */
export function allRows(run) {
  const rows = [];
  for (const key of ['kestrel', 'kestrel_cpu', 'kestrel_cpu_1_thread']) {
    const r = run.native?.[key];
    if (r && !r.error) rows.push(...kestrelNativeRows(r));
  }
  // llama.cpp's CPU build at the run's threads and at 1, and its Vulkan build on the same device.
  for (const key of ['llama_cpp', 'llama_cpp_1_thread', 'llama_cpp_vulkan']) {
    const r = run.native?.[key];
    if (r && !r.error) rows.push(...llamaCppRows(r, run.settings.native.threads));
  }
  for (const [name, r] of Object.entries(run.native ?? {})) {
    if (r?.error) rows.push({ env: 'native', engine: name.startsWith('kestrel') ? 'Kestrel' : 'llama.cpp', backend: name, note: `failed: ${r.error}` });
  }
  for (const e of run.browser?.engines ?? []) rows.push(...browserRows(e));
  if (run.browser?.error) rows.push({ env: 'browser', engine: 'all', backend: '', note: `failed: ${run.browser.error}` });
  return rows;
}

/** Kestrel / peer for each figure, for every peer row with the same environment and prompt length:
 * the Kestrel row on the same kind of device and thread count (`pairs`) where there is one. */
export function ratios(rows) {
  const out = [];
  for (const peer of rows.filter((r) => r.engine !== 'Kestrel' && r.decode_tok_s != null)) {
    const candidates = rows.filter((r) => r.engine === 'Kestrel' && r.env === peer.env && r.prompt_tokens === peer.prompt_tokens && r.decode_tok_s != null);
    const k = candidates.find((r) => r.pairs != null && r.pairs === peer.pairs) ?? candidates[0];
    if (!k) continue;
    const q = (a, b) => (a != null && b ? a / b : null);
    out.push({
      env: peer.env, kestrel: k.backend, peer: `${peer.engine} (${peer.backend})`, prompt_tokens: peer.prompt_tokens,
      load: q(k.load_ms, peer.load_ms), ttft: q(k.ttft_ms, peer.ttft_ms), prefill: q(k.prefill_tok_s, peer.prefill_tok_s),
      decode: q(k.decode_tok_s, peer.decode_tok_s), itl_p50: q(k.itl_ms?.p50, peer.itl_ms?.p50), memory: k.memory_what === peer.memory_what ? q(k.memory_bytes, peer.memory_bytes) : null,
    });
  }
  return out;
}

export function markdown(run) {
  const rows = allRows(run);
  const m = run.machine;
  const lines = [
    `Run ${run.started} on ${m.cpu} (${m.logical_cpus} logical CPUs, ${mib(m.memory_bytes)} RAM, load average ${m.loadavg_start.map((l) => l.toFixed(1)).join(' ')} at the start), ${m.os}.`,
    `Model ${run.model.file} (${mib(run.model.bytes)}). Native: ${run.native?.kestrel?.adapter ? `${run.native.kestrel.adapter.name} (${run.native.kestrel.adapter.backend}; ${run.native.kestrel.adapter.features.join(', ') || 'no optional features'})` : '–'}; browser: ${run.browser?.browser ?? '–'}, WebGPU adapter ${adapterName(run.browser?.adapter)} (${KEY_FEATURES.map((f) => `${f}: ${run.browser?.adapter?.features?.includes(f) ? 'yes' : 'no'}`).join(', ')}).`,
  ];
  // None where every part but one of the tables below was skipped.
  if (rows.length) {
    lines.push(
      'Times are medians over the repeats; ITL is the time between streamed tokens (p50 / p90 / p99 over every step of every repeat).',
      '',
      '| env | engine | backend | prompt | decode | repeats | load (cold / warm) | TTFT | prefill tok/s | decode tok/s | ITL p50 / p90 / p99 ms | memory | main thread: longest task, dropped frames | longest GPU submission of a prompt |',
      '|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
    );
  }
  for (const r of rows) {
    if (r.note) {
      lines.push(`| ${r.env} | ${r.engine} | ${r.backend} | | | | ${r.note} | | | | | | | |`);
      continue;
    }
    const load = r.warm_load_ms != null ? `${secs(r.load_ms)} / ${secs(r.warm_load_ms)}` : secs(r.load_ms);
    const itl = r.itl_ms ? `${fmt(r.itl_ms.p50)} / ${fmt(r.itl_ms.p90)} / ${fmt(r.itl_ms.p99)}` : '–';
    // The Long Tasks API reports only tasks over 50 ms.
    const longest = r.long_tasks === 0 ? 'none over 50 ms' : `${fmt(r.longest_task_ms, 0)} ms`;
    const main = r.longest_task_ms != null || r.dropped_frames != null ? `${longest}, ${r.dropped_frames ?? '–'} dropped` : '–';
    const gpu = r.gpu_weight_bytes != null ? `, ${mib(r.gpu_weight_bytes)} GPU weights` : '';
    const mem = r.memory_bytes != null ? `${mib(r.memory_bytes)} (${r.memory_what})${gpu}` : '–';
    lines.push(`| ${r.env} | ${r.engine} | ${r.backend} | ${r.prompt_tokens} | ${r.decode_tokens} | ${r.repeats ?? '–'} | ${load} | ${secs(r.ttft_ms)} | ${fmt(r.prefill_tok_s, 2)} | ${fmt(r.decode_tok_s, 2)} | ${itl} | ${mem} | ${main} | ${r.longest_submission_ms != null ? `${fmt(r.longest_submission_ms, 0)} ms` : '–'} |`);
  }
  const rat = ratios(rows);
  if (rat.length) {
    lines.push('', 'Kestrel / peer (above 1: Kestrel is larger; for tok/s larger is faster, for times and memory smaller is better):', '');
    lines.push('| env | Kestrel | peer | prompt | load | TTFT | prefill tok/s | decode tok/s | ITL p50 | memory |', '|---|---|---|--:|--:|--:|--:|--:|--:|--:|');
    for (const r of rat) lines.push(`| ${r.env} | ${r.kestrel} | ${r.peer} | ${r.prompt_tokens} | ${x(r.load)} | ${x(r.ttft)} | ${x(r.prefill)} | ${x(r.decode)} | ${x(r.itl_p50)} | ${x(r.memory)} |`);
  }
  const batch = run.native?.kestrel_batch;
  if (batch?.rows) {
    lines.push('', `Batched decode, native CPU backend (${batch.simd}, ${batch.threads} threads): ${batch.prompt_tokens}-token prompts, ${batch.decode_tokens} decode steps, all sequences' tokens per second (kestrel bench batch).`, '');
    lines.push(...batchTable(batch.rows, 'sequence'));
    const a = batch.admission;
    const p = (q) => (q ? `${fmt(q.p50, 0)} / ${fmt(q.p99, 0)}` : '–');
    if (a) lines.push('', `A ${a.long_prompt_tokens}-token prompt admitted while ${a.running} sequences decode, their ITL p50 / p99 ms: before ${p(a.before)}; in chunks of ${a.prefill_chunk} ${p(a.chunked)} (its TTFT ${secs(a.ttft_chunked_ms)}); in one step ${p(a.unchunked)} (TTFT ${secs(a.ttft_unchunked_ms)}).`);
  }
  const bb = run.browser?.batch;
  if (bb?.rows) {
    const where = bb.backend === 'cpu' ? `CPU backend (${bb.cpu?.simd}, ${bb.cpu?.threads} thread${bb.cpu?.threads === 1 ? '' : 's'})` : bb.backend;
    lines.push('', `Batched decode in the browser, Kestrel's ${where}, chosen by backend 'auto': concurrent requests on one engine with slots, ${bb.prompt_tokens}-token prompts, all requests' tokens per second while every one decodes (median of ${bb.repeats}).`, '');
    lines.push(...batchTable(bb.rows, 'request'));
  } else if (bb?.error) {
    lines.push('', `Batched decode in the browser: failed: ${bb.error}`);
  }
  lines.push(...constrainedLines(run.native ?? {}, run.browser?.constrained ?? []));
  if (run.browser_speculative) lines.push('', ...speculativeLines(run.browser_speculative, run.settings.browser_speculative));
  if (run.embeddings) lines.push('', ...embeddingLines(run.embeddings, run.browser?.embeddings));
  if (run.sizes?.length) lines.push('', ...sizesLines(run));
  const k = run.native?.kestrel;
  if (k?.roofline) {
    const f = k.roofline;
    lines.push('', `Roofline (native): decode runs at ${(100 * f.fraction_of_limit).toFixed(1)}% of this device's memory-bandwidth limit: ${(f.weight_bytes_per_token / 1e6).toFixed(1)} MB of weights per token at the copy kernel's ${f.copy_gb_per_s.toFixed(2)} GB/s is ${f.limit_ms_per_token.toFixed(1)} ms per token; achieved ${f.achieved_ms_per_token.toFixed(1)} ms.`);
  }
  if (k?.decode_step) {
    const s = k.decode_step;
    lines.push('', `Native decode step at position ${s.pos} by kernel family (${s.timing}, each family timed on its own): host encode + submit ${s.host_encode_submit_ms.toFixed(2)} ms of a ${s.host_step_ms.toFixed(0)} ms step.`, '');
    lines.push('| kernel family | GPU ms | share |', '|---|--:|--:|');
    for (const f of s.families) lines.push(`| ${f.family} | ${f.gpu_ms.toFixed(3)} | ${(100 * f.share).toFixed(1)}% |`);
    lines.push(`| sum | ${s.families_sum_gpu_ms.toFixed(1)} | |`);
  }
  return lines.join('\n') + '\n';
}


/** Structured output: each engine's decode under the schema against its free decode of as many
 * tokens, Kestrel's mask time per token, and Kestrel constrained over llama.cpp constrained. */
function constrainedLines(native, browser) {
  const parts = [
    ['Kestrel', 'CPU backend', native.kestrel_cpu_constrained],
    ['Kestrel', 'GPU', native.kestrel_constrained],
    ['llama.cpp', 'CPU, its JSON-schema grammar', native.llama_cpp_constrained],
    ...browser.map((r) => ['Kestrel in Chromium', r.backend === 'cpu' ? 'CPU backend (wasm)' : r.backend, r]),
  ].filter(([, , r]) => r);
  if (!parts.length) return [];
  const schema = parts.map(([, , r]) => r.schema).find(Boolean) ?? '–';
  const lines = ['', `Structured output (schema \`${schema}\`, greedy): decode under the schema against free decode of as many tokens (medians), and Kestrel's mask time per token on the host.`, ''];
  lines.push('| engine | backend | tokens | constrained tok/s | free tok/s | constrained / free | mask ms p50 / p90 / p99 |', '|---|---|--:|--:|--:|--:|--:|');
  for (const [engine, backend, r] of parts) {
    if (r.error) {
      lines.push(`| ${engine} | ${backend} | failed: ${r.error} | | | | |`);
      continue;
    }
    const mask = r.mask_ms ? `${fmt(r.mask_ms.p50, 3)} / ${fmt(r.mask_ms.p90, 3)} / ${fmt(r.mask_ms.p99, 3)}` : '–';
    lines.push(`| ${engine} | ${r.device ?? backend} | ${r.tokens} | ${fmt(r.constrained_tok_s.median, 1)} | ${fmt(r.free_tok_s.median, 1)} | ${x(r.ratio)} | ${mask} |`);
  }
  const k = native.kestrel_cpu_constrained;
  const l = native.llama_cpp_constrained;
  if (k?.constrained_tok_s && l?.constrained_tok_s) {
    lines.push('', `Kestrel's CPU backend constrained over llama.cpp constrained: ${x(k.constrained_tok_s.median / l.constrained_tok_s.median)}.`);
  }
  return lines;
}

/** Speculative decoding in Chromium: per workload, plain and lookup decode rates, lookup over
 * plain per pair, what lookup's drafts kept, and whether its answers were the plain ones. */
function speculativeLines(r, s) {
  const head = `Speculative decoding in Chromium on ${s.model.file} (${mib(s.model.bytes)})`;
  if (r.error) return [`${head}: failed: ${r.error}`];
  const cpu = r.cpu ? `, ${r.cpu.simd}, ${r.cpu.threads} thread${r.cpu.threads === 1 ? '' : 's'}` : '';
  const range = (v, digits, unit = '') => (v ? `${fmt(v.median, digits)}${unit} (${fmt(v.min, digits)}–${fmt(v.max, digits)})` : '–');
  const lines = [
    `${head}, ${r.browser}, Kestrel's ${r.backend === 'cpu' ? 'wasm CPU backend' : r.backend}${cpu}: each chat prompt of ${s.prompts} greedy, at most ${r.max_tokens} new tokens, plain (\`speculative: false\`) and with prompt lookup (drafts of at most ${r.speculative?.maxDraft ?? s.max_draft} tokens) alternately, ${r.repeats} pair${r.repeats === 1 ? '' : 's'} per prompt, which goes first alternating, the engine reset before each. Decode tok/s: the tokens after the first over the time from the first streamed token to the last; median (range) over the pairs.`,
    '',
    '| workload | prompts | pairs | plain decode tok/s | lookup decode tok/s | lookup / plain | tokens / verifying step | drafts kept | same text / tokens |',
    '|---|--:|--:|--:|--:|--:|--:|--:|---|',
  ];
  const yes = (b) => (b ? 'yes' : 'no');
  for (const w of r.workloads) {
    const kept = w.acceptance == null ? '–' : `${(100 * w.acceptance).toFixed(0)}%`;
    lines.push(`| ${w.workload} | ${w.prompts} | ${w.pairs.length} | ${range(w.plain_decode_tok_s, 2)} | ${range(w.lookup_decode_tok_s, 2)} | ${range(w.ratio, 2, '×')} | ${fmt(w.tokens_per_step, 2)} | ${kept} | ${yes(w.same_text)} / ${yes(w.same_tokens)} |`);
  }
  return lines;
}

/** The sizes people run (bench/sizes.mjs): each file's rows, round by round, then Kestrel over
 * llama.cpp in each round, the batched decode and the GPU path. */
function sizesLines(run) {
  const s = run.settings.sizes;
  const lines = [
    `At the sizes people run: synthetic models in the real layouts (random weights, written by \`kestrel bench model --synthetic\` and \`kestrel quantize\`), ${s.threads} threads each, ${s.rounds} alternating round${s.rounds === 1 ? '' : 's'}; load from the page cache; decode's share of the copy bandwidth is Kestrel's weight bytes per token at its decode rate over its CPU copy rate.`,
    '',
    '| model | round | engine | backend | load (GB/s of file) | prompt | prefill tok/s | decode tok/s | decode, share of copy bandwidth | peak RSS |',
    '|---|--:|---|---|--:|--:|--:|--:|--:|--:|',
  ];
  const ratioLines = ['| model | round | prompt | load time | prefill tok/s | decode tok/s | peak RSS |', '|---|--:|--:|--:|--:|--:|--:|'];
  const extra = [];
  for (const e of run.sizes) {
    const name = `${e.size} ${e.type}${e.bytes ? ` (${gb(e.bytes)})` : ''}`;
    if (e.error) {
      lines.push(`| ${name} | | | failed: ${e.error} | | | | | | |`);
      continue;
    }
    const rowsOf = (r, engine) => (r?.error ? [{ note: `failed: ${r.error}`, engine }] : r ? (engine === 'Kestrel' ? kestrelNativeRows(r) : llamaCppRows(r, s.threads)) : []);
    const push = (round, r, engine) => {
      for (const row of rowsOf(r, engine)) {
        if (row.note) {
          lines.push(`| ${name} | ${round} | ${engine} | ${row.note} | | | | | | |`);
          continue;
        }
        const roof = engine === 'Kestrel' && r.roofline && r.copy_gb_per_s ? r.model.weight_bytes_per_token * row.decode_tok_s / (r.copy_gb_per_s * 1e9) : null;
        lines.push(`| ${name} | ${round} | ${row.engine} | ${row.backend} | ${secs(row.load_ms)} (${e.bytes && row.load_ms ? (e.bytes / (row.load_ms * 1e6)).toFixed(2) : '–'}) | ${row.prompt_tokens} | ${fmt(row.prefill_tok_s, 2)} | ${fmt(row.decode_tok_s, 2)} | ${roof == null ? '–' : `${(100 * roof).toFixed(0)}%`} | ${r.peak_rss_bytes ? gb(r.peak_rss_bytes) : '–'} |`);
      }
    };
    const pair = (round, k, l) => {
      if (!k || !l || k.error || l.error) return;
      for (const kr of kestrelNativeRows(k)) {
        const lr = llamaCppRows(l, s.threads).find((r) => r.prompt_tokens === kr.prompt_tokens);
        if (!lr) continue;
        const q = (a, b) => (a != null && b ? a / b : null);
        ratioLines.push(`| ${name} | ${round} | ${kr.prompt_tokens} | ${x(q(kr.load_ms, lr.load_ms))} | ${x(q(kr.prefill_tok_s, lr.prefill_tok_s))} | ${x(q(kr.decode_tok_s, lr.decode_tok_s))} | ${x(q(k.peak_rss_bytes, l.peak_rss_bytes))} |`);
      }
    };
    e.rounds.forEach((r, i) => {
      push(i + 1, r.kestrel_cpu, 'Kestrel');
      push(i + 1, r.llama_cpp, 'llama.cpp');
      pair(i + 1, r.kestrel_cpu, r.llama_cpp);
    });
    if (e.kestrel_gpu || e.llama_cpp_vulkan) {
      push('GPU', e.kestrel_gpu, 'Kestrel');
      push('GPU', e.llama_cpp_vulkan, 'llama.cpp');
      pair('GPU', e.kestrel_gpu, e.llama_cpp_vulkan);
    }
    const mem = e.kestrel_gpu?.gpu_memory;
    if (mem?.peak_allocated_bytes) {
      const held = mem.weight_bytes + mem.kv_cache_bytes;
      extra.push(`${name}, Kestrel's GPU memory peak (the allocator's, during the load and after the workloads): ${gb(mem.peak_allocated_bytes)}, weights ${gb(mem.weight_bytes)} + KV cache ${gb(mem.kv_cache_bytes)} + ${(100 * (mem.peak_allocated_bytes / held - 1)).toFixed(1)}%.`);
    }
    const b = e.kestrel_batch;
    if (b?.rows) extra.push(`${name}, batched decode on the CPU backend: ${b.rows.map((r) => `${r.batch} sequence${r.batch === 1 ? '' : 's'} ${fmt(r.decode_tok_s.median, 1)} tok/s${r.ratio_to_batch_1 != null && r.batch !== 1 ? ` (${x(r.ratio_to_batch_1)} of one)` : ''}`).join(', ')}.`);
    else if (b?.error) extra.push(`${name}, batched decode: failed: ${b.error}`);
  }
  lines.push('', 'Kestrel / llama.cpp on the same file in the same round (above 1: Kestrel is larger; for tok/s larger is faster, for load time and memory smaller is better):', '', ...ratioLines);
  if (extra.length) lines.push('', ...extra);
  return lines;
}

/** The lines of a batch-size table: {batch, decode_tok_s: {median}, ratio_to_batch_1} rows. */
function batchTable(rows, unit) {
  const out = [`| ${unit}s | decode tok/s | × 1 ${unit} |`, '|--:|--:|--:|'];
  for (const r of rows) out.push(`| ${r.batch} | ${fmt(r.decode_tok_s.median, 1)} | ${r.ratio_to_batch_1 == null ? '–' : `${r.ratio_to_batch_1.toFixed(2)}×`} |`);
  return out;
}

/** The optional WebGPU features that decide what an engine can run. */
const KEY_FEATURES = ['shader-f16', 'subgroups', 'timestamp-query'];
const adapterName = (a) => (a ? [a.vendor, a.architecture, a.description].filter(Boolean).join(' ') || 'unnamed' : '–');

const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);

/**
 * Three panels of horizontal bars on log scales (the engines differ by orders of magnitude on a
 * software adapter): decode tok/s, prefill tok/s, ITL p50 ms; one bar per row with figures.
 */
export function svg(run) {
  const rows = allRows(run).filter((r) => !r.note);
  const panels = [
    ['decode tok/s (higher is better)', (r) => r.decode_tok_s],
    ['prefill tok/s (higher is better)', (r) => r.prefill_tok_s],
    ['inter-token latency p50, ms (lower is better)', (r) => r.itl_ms?.p50],
  ];
  const label = (r) => `${r.env} · ${r.engine} · ${r.backend.split(',')[0]} · ${r.prompt_tokens} tok`;
  const [W, labelW, barH, gap, head] = [900, 330, 16, 4, 28];
  const panelH = head + rows.length * (barH + gap) + 12;
  const colors = { Kestrel: '#2563eb', 'llama.cpp': '#dc2626', wllama: '#d97706' };
  let y = 36;
  const parts = [`<text x="10" y="22" font-size="15" font-weight="bold">Kestrel vs peers: ${esc(run.model.file)} on ${esc(run.machine.cpu)}</text>`];
  for (const [title, value] of panels) {
    const vals = rows.map(value).filter((v) => v > 0);
    const lo = Math.floor(Math.log10(Math.min(...vals, 1)));
    const hi = Math.ceil(Math.log10(Math.max(...vals, 1)));
    const x = (v) => labelW + ((Math.log10(v) - lo) / Math.max(1, hi - lo)) * (W - labelW - 70);
    parts.push(`<text x="10" y="${y + 16}" font-size="13" font-weight="bold">${esc(title)}, log scale</text>`);
    for (let d = lo; d <= hi; d += 1) {
      parts.push(`<line x1="${x(10 ** d)}" x2="${x(10 ** d)}" y1="${y + head - 4}" y2="${y + panelH - 12}" stroke="#ddd"/><text x="${x(10 ** d)}" y="${y + head - 6}" font-size="9" text-anchor="middle" fill="#666">${10 ** d}</text>`);
    }
    rows.forEach((r, i) => {
      const v = value(r);
      const top = y + head + i * (barH + gap);
      parts.push(`<text x="${labelW - 6}" y="${top + 12}" font-size="11" text-anchor="end">${esc(label(r))}</text>`);
      if (v > 0) {
        parts.push(`<rect x="${labelW}" y="${top}" width="${Math.max(1, x(v) - labelW)}" height="${barH}" fill="${colors[r.engine] ?? '#555'}"/><text x="${x(v) + 4}" y="${top + 12}" font-size="11">${fmt(v, 2)}</text>`);
      } else {
        parts.push(`<text x="${labelW + 4}" y="${top + 12}" font-size="11" fill="#999">–</text>`);
      }
    });
    y += panelH;
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${y + 10}" font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n${parts.join('\n')}\n</svg>\n`;
}

// `node bench/report.mjs RUN.json`: renders a run again (results/latest.md and .svg).
if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const file = process.argv[2];
  if (!file) {
    console.error('usage: node bench/report.mjs RUN.json');
    process.exit(2);
  }
  const run = JSON.parse(readFileSync(file, 'utf8'));
  writeFileSync(join(RESULTS, 'latest.md'), markdown(run));
  writeFileSync(join(RESULTS, 'latest.svg'), svg(run));
  console.log(markdown(run));
}
