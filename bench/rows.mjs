// Every engine's results, native or browser, reduced to the same row: one per engine and prompt
// length, every time in ms, every rate in tok/s, memory in bytes.
import { percentiles, spread } from './stats.mjs';

const row = (fields) => ({
  // `pairs`: what a Kestrel row is compared with (the peer row of the same key): 'gpu', or
  // 'cpu N' for N threads.
  env: null, engine: null, backend: null, pairs: null, prompt_tokens: null, decode_tokens: null, repeats: null,
  load_ms: null, warm_load_ms: null, ttft_ms: null, prefill_tok_s: null, decode_tok_s: null,
  itl_ms: null, memory_bytes: null, memory_what: null, gpu_weight_bytes: null, longest_task_ms: null, long_tasks: null, dropped_frames: null, longest_submission_ms: null, note: null,
  ...fields,
});

/** `kestrel bench model --json`, on either backend. */
export function kestrelNativeRows(r) {
  const cpu = r.backend === 'cpu' ? r.cpu : null;
  const mem = r.gpu_memory;
  return r.workloads.map((w) => row({
    env: 'native', engine: 'Kestrel',
    backend: cpu ? `CPU (${cpu.simd}), ${cpu.threads} thread${cpu.threads === 1 ? '' : 's'}` : `wgpu ${r.adapter.backend}, ${r.adapter.name}`,
    pairs: cpu ? `cpu ${cpu.threads}` : 'gpu',
    prompt_tokens: w.prompt_tokens, decode_tokens: w.decode_tokens, repeats: w.repeats,
    load_ms: r.load_ms, ttft_ms: w.ttft_ms?.median, prefill_tok_s: w.prefill_tok_s?.median,
    decode_tok_s: w.decode_tok_s?.median, itl_ms: w.itl_ms,
    memory_bytes: cpu ? cpu.weight_bytes + cpu.kv_cache_bytes : mem.allocator_allocated_bytes ?? mem.weight_bytes + mem.kv_cache_bytes,
    memory_what: cpu ? 'RAM weights + KV' : mem.allocator_allocated_bytes != null ? 'GPU allocated' : 'GPU weights + KV',
  }));
}

/** tools/llama-cpp/bench.mjs --json (schema kestrel-native-peer-bench/1). */
export function llamaCppRows(r, threads) {
  return r.runs.map((run) => row({
    env: 'native', engine: 'llama.cpp',
    backend: r.settings?.gpu === 'vulkan' ? `Vulkan, ${r.settings.gpu_device ?? '?'}` : `CPU, ${r.settings?.threads ?? threads} thread${(r.settings?.threads ?? threads) === 1 ? '' : 's'}`,
    pairs: r.settings?.gpu === 'vulkan' ? 'gpu' : `cpu ${r.settings?.threads ?? threads}`,
    prompt_tokens: run.prompt_tokens, decode_tokens: run.decode_tokens, repeats: r.settings?.repeats,
    load_ms: (r.load?.model_ms ?? 0) + (r.load?.context_ms ?? 0),
    // Its prefill time includes the pick of the first token: the time to first token.
    ttft_ms: run.prefill?.median_ms, prefill_tok_s: run.prefill?.median_tok_per_s,
    decode_tok_s: run.decode?.median_tok_per_s, itl_ms: run.decode?.token_ms,
  }));
}

/** One engine of www/bench (runKestrel / runWllama), or why it did not run. */
export function browserRows(e) {
  const engine = e.engine === 'kestrel' ? 'Kestrel' : 'wllama';
  const kestrelCpu = e.engine === 'kestrel' && (e.backend === 'cpu' || e.name === 'kestrel-cpu');
  const backend = kestrelCpu ? `wasm CPU (${e.cpu?.simd ?? '?'}), ${e.cpu?.threads ?? 1} thread${(e.cpu?.threads ?? 1) === 1 ? '' : 's'}`
    : e.engine === 'kestrel' ? `WebGPU, ${e.gpu?.adapter ?? '?'}` : e.backend === 'webgpu' ? 'WebGPU' : `wasm CPU, ${e.threads ?? '?'} threads`;
  // Kestrel's WebGPU rows pair with wllama's WebGPU, its CPU rows with wllama's CPU build.
  const pairs = kestrelCpu || (e.engine !== 'kestrel' && e.backend !== 'webgpu') ? 'cpu' : 'gpu';
  if (e.cannot_run || e.error) {
    return [row({ env: 'browser', engine, backend, pairs, note: e.cannot_run ? `cannot run: ${e.cannot_run}` : `failed: ${e.error}` })];
  }
  return e.workloads.map((w) => {
    const runs = w.runs;
    return row({
      env: 'browser', engine, backend, pairs, prompt_tokens: runs[0]?.prompt_tokens ?? w.prompt_tokens, decode_tokens: w.decode_tokens, repeats: w.repeats,
      load_ms: e.cold_load_ms, warm_load_ms: e.warm_load_ms ?? null,
      ttft_ms: spread(runs.map((r) => r.ttft_ms))?.median, prefill_tok_s: spread(runs.map((r) => r.prefill_tok_s))?.median,
      decode_tok_s: spread(runs.map((r) => r.decode_tok_s))?.median, itl_ms: percentiles(runs.flatMap((r) => r.itl_ms)),
      // The engine workers' linear memory (www/bench/wasm-heap.js); for Kestrel the weights and
      // KV cache are on the GPU besides. measureUserAgentSpecificMemory() (kept in the JSON)
      // counts only JS heaps in headless Chromium 156.
      memory_bytes: e.wasm_heap_bytes ?? null, memory_what: 'wasm heap peak', gpu_weight_bytes: kestrelCpu ? null : e.model?.weight_bytes ?? null,
      longest_task_ms: e.main_thread?.longest_task_ms, long_tasks: e.main_thread?.long_tasks, dropped_frames: e.main_thread?.dropped_frames,
      // Kestrel's longest GPU submission of a prompt over the repeats (its decode steps are one
      // submission each: their time is the ITL).
      longest_submission_ms: runs.some((r) => r.longest_submission_ms != null) ? Math.max(...runs.map((r) => r.longest_submission_ms ?? 0)) : null,
    });
  });
}
