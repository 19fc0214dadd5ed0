#!/usr/bin/env node
// Kestrel's benchmark suite, end to end: the native CLI and llama.cpp on the same GGUF, then
// headless Chromium with Kestrel's package and wllama (CPU threads, and WebGPU where the adapter
// allows); writes results/<stamp>.json (everything), results/latest.md (the table) and
// results/latest.svg (the chart).
//
//   node bench/run.mjs [--model models/X.gguf] [--threads 2]
//       [--prompt-tokens 32] [--decode-tokens 16] [--repeats 2]                  native sizes
//       [--browser-prompt-tokens 16] [--browser-decode-tokens 4] [--browser-repeats 2]
//       [--browser-batch-sizes 1,2,4] [--browser-batch-decode-tokens 16]   concurrent requests
//                           on one engine ('auto' backend: the CPU on a software adapter)
//       [--browser-speculative models/X.gguf]   also speculative decoding in Chromium on that
//                           model (opt-in): the wasm CPU backend with prompt lookup against plain
//                           decoding, --browser-repeats pairs per chat prompt of
//                           [--browser-speculative-prompts bench/data/speculative-prompts.json],
//                           at most [--browser-speculative-tokens 128] new tokens each, drafts of at
//                           most [--browser-speculative-max-draft 16] tokens
//       [--full]            the workload everywhere: prompts 128,512, 128 decode steps, 5 repeats
//       [--smoke]           every part at its smallest (8-token prompts, 2 steps, 1 repeat; batches of
//                           1 and 2): `./build.sh test` runs it to keep the suite working
//       [--results DIR]     write there instead of bench/results/
//       [--gpu]             Chromium on the machine's GPU instead of SwiftShader
//       [--sizes 1b,8b]     also the sizes people run (bench/sizes.mjs): synthetic models of those
//                           shapes written to models/ in each of --size-types (default q4_k_m),
//                           Kestrel's CPU backend against llama.cpp's in --size-rounds alternating
//                           rounds (default 2), batched decode, and up to --gpu-sizes-up-to (default
//                           1b) the GPU path against llama.cpp Vulkan; their workload:
//       [--size-prompt-tokens 128] [--size-decode-tokens 32] [--size-repeats 2]
//       [--schema nested_address]   the JSON Schema of the structured-output part (an id of
//                           tests/data/constrained/schemas.json; --smoke: enum_color, the shortest
//                           answer): Kestrel on the CPU backend and the GPU, and llama.cpp's
//                           grammar, constrained against free decode
//       [--embedding-model models/all-MiniLM-L6-v2.f32.gguf] [--embedding-inputs 256]
//                           [--embedding-tokens 32]   an embedding model's sentences per second,
//                           Kestrel's CPU backend against llama.cpp's embedding context on the same
//                           token ids and threads (two alternating rounds)
//       [--skip native,batch,llama,constrained,embeddings,browser,browser-batch,sizes-batch,sizes-gpu]   leave parts out
//       [--browser-engines kestrel,kestrel-cpu,wllama-cpu,wllama-webgpu]   only these in Chromium
//
// The defaults fit a 2-core machine without a GPU (lavapipe natively, SwiftShader in Chrome,
// where decode takes one to several seconds per token); on a real GPU use --full --gpu.
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { basename, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { runBrowser, runBrowserSpeculative } from './browser.mjs';
import { promptTexts, runKestrelBatch, runKestrelConstrained, runKestrelEmbed, runKestrelNative, runLlamaConstrained, runLlamaCpp, runLlamaEmbed } from './native.mjs';
import { ROOT, RESULTS } from './paths.mjs';
import { markdown, svg } from './report.mjs';
import { SIZES, failedSizes, runSizes } from './sizes.mjs';

const { values: opt } = parseArgs({
  options: {
    model: { type: 'string', default: 'models/SmolLM2-135M-Instruct.Q4_1.gguf' },
    threads: { type: 'string', default: '2' },
    'prompt-tokens': { type: 'string', default: '32' },
    'decode-tokens': { type: 'string', default: '16' },
    repeats: { type: 'string', default: '2' },
    'browser-prompt-tokens': { type: 'string', default: '16' },
    'browser-decode-tokens': { type: 'string', default: '4' },
    'browser-repeats': { type: 'string', default: '2' },
    'browser-batch-sizes': { type: 'string', default: '1,2,4' },
    'browser-batch-decode-tokens': { type: 'string', default: '16' },
    'browser-speculative': { type: 'string' },
    'browser-speculative-prompts': { type: 'string', default: 'bench/data/speculative-prompts.json' },
    'browser-speculative-tokens': { type: 'string', default: '128' },
    'browser-speculative-max-draft': { type: 'string', default: '16' },
    full: { type: 'boolean', default: false },
    smoke: { type: 'boolean', default: false },
    results: { type: 'string', default: RESULTS },
    gpu: { type: 'boolean', default: false },
    skip: { type: 'string', default: '' },
    'browser-engines': { type: 'string', default: '' },
    sizes: { type: 'string', default: '' },
    'size-types': { type: 'string', default: 'q4_k_m' },
    'size-rounds': { type: 'string', default: '2' },
    'size-prompt-tokens': { type: 'string', default: '128' },
    'size-decode-tokens': { type: 'string', default: '32' },
    'size-repeats': { type: 'string', default: '2' },
    'gpu-sizes-up-to': { type: 'string', default: '1b' },
    schema: { type: 'string' },
    'embedding-model': { type: 'string', default: 'models/all-MiniLM-L6-v2.f32.gguf' },
    'embedding-inputs': { type: 'string', default: '256' },
    'embedding-tokens': { type: 'string', default: '32' },
    help: { type: 'boolean', default: false },
  },
});
if (opt.help) {
  // The usage is this file's header comment.
  const header = readFileSync(new URL(import.meta.url), 'utf8').split('\n').filter((l) => l.startsWith('//'));
  console.log(header.map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
  process.exit(0);
}

/** A positive integer option, or exit with a usage error. */
function count(name, value) {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) {
    console.error(`--${name} must be a positive integer, got ${JSON.stringify(value)}`);
    process.exit(2);
  }
  return n;
}
const counts = (name, value) => String(value).split(',').map((v) => count(name, v));

/** The option `name`'s GGUF file and the URL the browser fetches it at, or exit with a usage error. */
function servedModel(name, value) {
  const file = resolve(ROOT, value);
  if (resolve(ROOT, 'models', basename(file)) !== file) {
    console.error(`--${name} must be in models/ (the browser fetches it from the static server): ${file}`);
    process.exit(2);
  }
  if (!existsSync(file)) {
    console.error(`--${name}: no such file: ${file}`);
    process.exit(2);
  }
  return { file, url: `/models/${basename(file)}` };
}
const { file: model, url: modelUrl } = servedModel('model', opt.model);
const threads = count('threads', opt.threads);
if (opt.full && opt.smoke) {
  console.error('--full and --smoke are two sizes of the whole suite: give one');
  process.exit(2);
}
// The structured-output part's schema: a smoke only needs the path to run, so the shortest answer.
const schemaId = opt.schema ?? (opt.smoke ? 'enum_color' : 'nested_address');
/**
 * Prompt lengths, decode steps and repeats: the workload (--full), each part's smallest
 * (--smoke), or else the options whose names start with `prefix`.
 */
function sizes(prefix) {
  if (opt.full) return { prompt_tokens: [128, 512], decode_tokens: 128, repeats: 5 };
  if (opt.smoke) return { prompt_tokens: [8], decode_tokens: 2, repeats: 1 };
  const name = (n) => `${prefix}${n}`;
  return {
    prompt_tokens: counts(name('prompt-tokens'), opt[name('prompt-tokens')]),
    decode_tokens: count(name('decode-tokens'), opt[name('decode-tokens')]),
    repeats: count(name('repeats'), opt[name('repeats')]),
  };
}
const settings = {
  native: { ...sizes(''), threads, batch: opt.smoke ? { sizes: [1, 2], long_prompt: 16 } : { sizes: [1, 2, 4, 8], long_prompt: 512 } },
  browser: {
    ...sizes('browser-'),
    threads,
    gpu: opt.gpu,
    batch: opt.smoke
      ? { sizes: [1, 2], decode_tokens: 4 }
      : { sizes: counts('browser-batch-sizes', opt['browser-batch-sizes']), decode_tokens: count('browser-batch-decode-tokens', opt['browser-batch-decode-tokens']) },
  },
};
// `kestrel quantize`'s types.
const TYPES = ['q4_k_m', 'q4_k', 'q5_k', 'q6_k', 'q8_0', 'q5_0', 'q5_1', 'q4_0', 'q4_1', 'f16', 'f32'];
/** A comma-separated list of `allowed` values, or exit with a usage error. */
function choices(name, value, allowed) {
  const list = String(value).split(',').filter(Boolean);
  const bad = list.filter((v) => !allowed.includes(v));
  if (bad.length) {
    console.error(`--${name}: ${bad.join(', ')} is not one of ${allowed.join(', ')}`);
    process.exit(2);
  }
  return list;
}
const sizeSettings = {
  ...(opt.full ? { prompt_tokens: [128, 512], decode_tokens: 128, repeats: 3 }
    : opt.smoke ? { prompt_tokens: [8], decode_tokens: 2, repeats: 1 }
      : { prompt_tokens: counts('size-prompt-tokens', opt['size-prompt-tokens']), decode_tokens: count('size-decode-tokens', opt['size-decode-tokens']), repeats: count('size-repeats', opt['size-repeats']) }),
  rounds: opt.smoke ? 1 : count('size-rounds', opt['size-rounds']),
  threads,
  // 8 sequences against 1: the measure of a step that reads the weights once for all.
  batch_sizes: opt.smoke ? [1, 2] : [1, 8],
  gpu_up_to: choices('gpu-sizes-up-to', opt['gpu-sizes-up-to'], SIZES)[0] ?? '1b',
};
settings.sizes = { sizes: choices('sizes', opt.sizes, SIZES), types: choices('size-types', opt['size-types'], TYPES), ...sizeSettings };
/** The speculative part's chat prompts by workload ({name: [text]}), or exit with a usage error. */
function speculativePrompts(file) {
  try {
    const { workloads } = JSON.parse(readFileSync(file, 'utf8'));
    const lists = Object.values(workloads ?? {});
    if (!lists.length || !lists.every((l) => Array.isArray(l) && l.length && l.every((t) => typeof t === 'string'))) {
      throw new Error('expected {"workloads": {"name": ["prompt", ...], ...}}');
    }
    return workloads;
  } catch (e) {
    console.error(`--browser-speculative-prompts ${file}: ${e.message}`);
    process.exit(2);
  }
}
/** The speculative part (opt-in): its model's URL and its chat prompts, beside its settings. */
let speculative = null;
if (opt['browser-speculative']) {
  const { file, url } = servedModel('browser-speculative', opt['browser-speculative']);
  speculative = { modelUrl: url, workloads: speculativePrompts(resolve(ROOT, opt['browser-speculative-prompts'])) };
  settings.browser_speculative = {
    model: { file: basename(file), bytes: statSync(file).size },
    prompts: opt['browser-speculative-prompts'],
    max_tokens: count('browser-speculative-tokens', opt['browser-speculative-tokens']),
    max_draft: count('browser-speculative-max-draft', opt['browser-speculative-max-draft']),
    // Pairs per prompt, as `kestrel bench model --lookup` runs --repeats of them.
    repeats: settings.browser.repeats,
  };
}
const results = resolve(opt.results);
const skip = new Set(opt.skip.split(',').filter(Boolean));

const started = new Date();
const stamp = started.toISOString().replace(/[:.]/g, '-');
const raw = join(results, 'raw', stamp);
mkdirSync(raw, { recursive: true });
const run = {
  schema: 'kestrel-bench/1',
  started: started.toISOString(),
  machine: {
    os: `${os.type()} ${os.release()} ${os.arch()}`,
    cpu: os.cpus()[0]?.model?.trim() ?? 'unknown CPU',
    logical_cpus: os.cpus().length,
    memory_bytes: os.totalmem(),
    loadavg_start: os.loadavg(),
    node: process.version,
  },
  model: { file: basename(model), bytes: statSync(model).size },
  settings,
  native: {},
  browser: null,
  browser_speculative: null,
  sizes: null,
};

/** The structured-output part's schema and question, from the suite the tests validate against. */
function schemaCase(id) {
  const suite = JSON.parse(readFileSync(join(ROOT, 'tests/data/constrained/schemas.json'), 'utf8')).schemas;
  const found = suite.find((c) => c.id === id);
  if (!found) throw new Error(`--schema ${id} is not an id of tests/data/constrained/schemas.json`);
  return { schema: found.schema, ask: found.ask };
}

// Each part records its error instead of ending the run: the others still say something.
const attempt = async (what, fn) => {
  const t = performance.now();
  console.error(`\n== ${what}`);
  try {
    return await fn();
  } catch (e) {
    console.error(`${what} failed: ${e.message}`);
    return { error: e.message.split('\n')[0] };
  } finally {
    console.error(`== ${what}: ${((performance.now() - t) / 1e3).toFixed(0)} s`);
  }
};

const n = settings.native;
if (!skip.has('native')) {
  const kestrel = (what, key, options) => attempt(what, () => runKestrelNative({
    model, promptTokens: n.prompt_tokens, decodeTokens: n.decode_tokens, repeats: n.repeats, ...options, out: join(raw, `${key}.json`),
  })).then((result) => { run.native[key] = result; });
  await kestrel('Kestrel, native, GPU', 'kestrel', { backend: 'gpu' });
  // The CPU backend beside llama.cpp's CPU build at the same thread counts.
  await kestrel('Kestrel, native, CPU', 'kestrel_cpu', { backend: 'cpu', threads });
  if (threads !== 1) await kestrel('Kestrel, native, CPU, 1 thread', 'kestrel_cpu_1_thread', { backend: 'cpu', threads: 1 });
}
if (!skip.has('batch')) {
  run.native.kestrel_batch = await attempt('Kestrel, native, CPU, batched decode', () => runKestrelBatch({
    model, decodeTokens: n.decode_tokens, repeats: n.repeats, threads, batchSizes: n.batch.sizes, longPrompt: n.batch.long_prompt, out: join(raw, 'kestrel_batch.json'),
  }));
}
if (!skip.has('llama')) {
  const llama = (what, key, options) => attempt(what, async () => {
    run.native[key] = await runLlamaCpp({
      model, promptTokens: n.prompt_tokens, decodeTokens: n.decode_tokens, repeats: n.repeats, ...options, out: join(raw, `${key}.json`),
    });
  }).then((failed) => { if (failed?.error) run.native[key] = failed; });
  await llama('llama.cpp, native', 'llama_cpp', { threads });
  // On a shared 2-core machine its multi-threaded decode swings widely; 1 thread holds steadier.
  if (threads !== 1) await llama('llama.cpp, native, 1 thread', 'llama_cpp_1_thread', { threads: 1 });
  // The fair peer of Kestrel's GPU kernels: llama.cpp's own Vulkan kernels on the same device.
  await llama('llama.cpp Vulkan, native', 'llama_cpp_vulkan', { threads, gpu: 'vulkan' });
}
if (!skip.has('constrained')) {
  // Structured output: the same schema, greedy, constrained against free decode of as many tokens.
  const repeats = opt.smoke ? 1 : n.repeats;
  const constrained = (what, key, fn) => attempt(what, () => fn(join(raw, `${key}.json`))).then((r) => { run.native[key] = r; });
  await constrained('Kestrel, native, CPU, constrained', 'kestrel_cpu_constrained',
    (out) => runKestrelConstrained({ model, backend: 'cpu', schema: schemaId, repeats, threads, out }));
  await constrained('Kestrel, native, GPU, constrained', 'kestrel_constrained',
    (out) => runKestrelConstrained({ model, backend: 'gpu', schema: schemaId, repeats, out }));
  await constrained('llama.cpp, native, constrained', 'llama_cpp_constrained',
    (out) => runLlamaConstrained({ model, schema: schemaId, repeats, threads, out }));
}
/** The embeddings part's token ids, for the browser to embed the same. */
let embeddingInputs = null;
if (!skip.has('embeddings')) {
  // Sentences per second: the same inputs' token ids, the same threads, two alternating rounds
  // (one in a smoke run) so the machine's drift falls on both.
  const e = { model: resolve(ROOT, opt['embedding-model']), inputs: opt.smoke ? 16 : count('embedding-inputs', opt['embedding-inputs']),
    tokens: count('embedding-tokens', opt['embedding-tokens']), repeats: opt.smoke ? 1 : n.repeats, threads };
  run.embeddings = { settings: { ...e, model: basename(e.model) }, rounds: [] };
  const inputsFile = join(raw, 'embedding_inputs.json');
  for (let round = 0; round < (opt.smoke ? 1 : 2); round++) {
    const kestrel = await attempt(`Kestrel, native, CPU, embeddings (round ${round + 1})`,
      () => runKestrelEmbed({ ...e, inputsOut: inputsFile, out: join(raw, `kestrel_embed_${round}.json`) }));
    const llama = await attempt(`llama.cpp, native, embeddings (round ${round + 1})`,
      () => runLlamaEmbed({ ...e, inputsFile, out: join(raw, `llama_cpp_embed_${round}.json`) }));
    run.embeddings.rounds.push({ kestrel, llama_cpp: llama });
  }
  if (existsSync(inputsFile)) embeddingInputs = JSON.parse(readFileSync(inputsFile, 'utf8'));
}
if (!skip.has('browser')) {
  const b = settings.browser;
  run.browser = await attempt('browser', async () => {
    const prompts = await promptTexts({ model, promptTokens: b.prompt_tokens });
    const bad = prompts.filter((p) => !p.round_trips).map((p) => p.prompt_tokens);
    if (bad.length) console.error(`warning: the prompt text of ${bad.join(', ')} tokens does not re-encode to the same ids`);
    return runBrowser({
      modelUrl, prompts, decodeTokens: b.decode_tokens, repeats: b.repeats, threads, realGpu: b.gpu, only: opt['browser-engines'] ? opt['browser-engines'].split(',') : null,
      contextLength: Math.max(...b.prompt_tokens) + b.decode_tokens + 64,
      batch: skip.has('browser-batch') ? null : { sizes: b.batch.sizes, decodeTokens: b.batch.decode_tokens },
      constrained: skip.has('constrained') ? null : schemaCase(schemaId),
      embeddings: embeddingInputs ? { modelUrl: `/models/${basename(opt['embedding-model'])}`, inputs: embeddingInputs, repeats: b.repeats } : null,
    });
  });
}
if (speculative) {
  const s = settings.browser_speculative;
  run.browser_speculative = await attempt('browser, speculative decoding', () => runBrowserSpeculative({
    ...speculative, maxTokens: s.max_tokens, maxDraft: s.max_draft, repeats: s.repeats,
  }));
}
if (settings.sizes.sizes.length) {
  const { sizes, types, ...sizeRun } = settings.sizes;
  run.sizes = await runSizes({ sizes, types, settings: sizeRun, raw, attempt, skip });
}
run.machine.loadavg_end = os.loadavg();
run.wall_s = (Date.now() - started.getTime()) / 1e3;

// The JSON first: a report that fails to render can be made again from it (report.mjs FILE).
const json = join(results, `${stamp}.json`);
writeFileSync(json, JSON.stringify(run, null, 2) + '\n');
writeFileSync(join(results, 'latest.json'), JSON.stringify(run, null, 2) + '\n');
const table = markdown(run);
writeFileSync(join(results, 'latest.md'), table);
writeFileSync(join(results, 'latest.svg'), svg(run));
console.log(`\n${table}`);
console.error(`wrote ${json}, ${join(results, 'latest.md')}, ${join(results, 'latest.svg')} (${run.wall_s.toFixed(0)} s)`);

// Every part's figures are written; the exit status says whether any part failed.
const failed = [
  ...Object.entries(run.native).filter(([, r]) => r?.error).map(([key]) => key),
  ...(run.embeddings?.rounds ?? []).flatMap((r, i) => Object.entries(r).filter(([, x]) => x?.error).map(([k]) => `${k} embeddings round ${i + 1}`)),
  ...(run.browser?.error ? ['browser'] : []),
  ...(run.browser?.embeddings?.error ? ['browser embeddings'] : []),
  ...(run.browser?.engines ?? []).filter((e) => e.error).map((e) => `browser ${e.name}`),
  ...(run.browser?.batch?.error ? ['browser batch'] : []),
  ...(run.browser?.constrained ?? []).filter((c) => c.error).map((c) => `browser ${c.backend} constrained`),
  ...(run.browser_speculative?.error ? ['browser speculative'] : []),
  ...failedSizes(run.sizes),
];
if (failed.length) {
  console.error(`failed: ${failed.join(', ')}`);
  process.exit(1);
}
