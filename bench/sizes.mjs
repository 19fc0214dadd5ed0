// The suite at the sizes people run (`--sizes 1b,8b`): models in the real layouts of Llama 3.2 1B
// and Llama 3.1 8B with random weights (`kestrel bench model --synthetic`), written to models/ as
// GGUF files in each type asked for (`kestrel quantize`), so that every engine runs the same file.
// On each file: Kestrel's CPU backend and llama.cpp's CPU build in alternating rounds (the
// machine's drift falls on both alike), Kestrel's batched decode (8 sequences against 1), and up
// to `gpuUpTo` the GPU path against llama.cpp's Vulkan build on the same device.
import { existsSync, renameSync, rmSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import { exec, runKestrelBatch, runKestrelNative, runLlamaCpp } from './native.mjs';
import { KESTREL, ROOT } from './paths.mjs';

/** The sizes `kestrel bench model --synthetic` writes, smallest first. */
export const SIZES = ['135m', '1b', '8b'];

/** The GGUF file of `size` in weight type `type` under models/, written where it is missing (a
 * run cut short leaves only a `.tmp`, never a partial file under the final name). */
export async function sizedModel(size, type) {
  const file = join(ROOT, 'models', `synthetic-${size}-${type}.gguf`);
  if (existsSync(file)) return file;
  const written = `${file}.written.tmp`;
  try {
    await exec(KESTREL, ['bench', 'model', '--synthetic', size, '--write', written]);
    await exec(KESTREL, ['quantize', '--type', type, written, `${file}.tmp`]);
    renameSync(`${file}.tmp`, file);
  } finally {
    rmSync(written, { force: true });
    rmSync(`${file}.tmp`, { force: true });
  }
  return file;
}

/**
 * Runs every size in every type. `settings`: {prompt_tokens, decode_tokens, repeats, rounds,
 * threads, batch_sizes, gpu_up_to}; `attempt(what, fn)` runs a part and returns its result or
 * {error}; `skip` may hold 'sizes-batch' and 'sizes-gpu'. Resolves to one entry per file.
 */
export async function runSizes({ sizes, types, settings, raw, attempt, skip }) {
  const entries = [];
  for (const size of sizes) {
    for (const type of types) {
      const entry = { size, type, rounds: [] };
      entries.push(entry);
      const file = await attempt(`${size} ${type}: the file`, () => sizedModel(size, type));
      if (file?.error) {
        entry.error = file.error;
        continue;
      }
      Object.assign(entry, { file: basename(file), bytes: statSync(file).size });
      const workload = { model: file, promptTokens: settings.prompt_tokens, decodeTokens: settings.decode_tokens, repeats: settings.repeats };
      const key = `${size}-${type}`;
      for (let round = 1; round <= settings.rounds; round++) {
        const kestrel = await attempt(`${key}, round ${round}: Kestrel, CPU`, () => runKestrelNative({
          ...workload, backend: 'cpu', threads: settings.threads, out: join(raw, `${key}-${round}-kestrel-cpu.json`),
        }));
        const llama = await attempt(`${key}, round ${round}: llama.cpp, CPU`, () => runLlamaCpp({
          ...workload, threads: settings.threads, out: join(raw, `${key}-${round}-llama-cpp.json`),
        }));
        entry.rounds.push({ kestrel_cpu: kestrel, llama_cpp: llama });
      }
      if (!skip.has('sizes-batch')) {
        entry.kestrel_batch = await attempt(`${key}: Kestrel, CPU, batched decode`, () => runKestrelBatch({
          model: file, decodeTokens: settings.decode_tokens, repeats: settings.repeats, threads: settings.threads,
          batchSizes: settings.batch_sizes, longPrompt: 0, out: join(raw, `${key}-kestrel-batch.json`),
        }));
      }
      // The GPU path runs on lavapipe here, where an 8B decode step takes many seconds.
      if (!skip.has('sizes-gpu') && SIZES.indexOf(size) <= SIZES.indexOf(settings.gpu_up_to)) {
        entry.kestrel_gpu = await attempt(`${key}: Kestrel, GPU`, () => runKestrelNative({
          ...workload, backend: 'gpu', out: join(raw, `${key}-kestrel-gpu.json`),
        }));
        entry.llama_cpp_vulkan = await attempt(`${key}: llama.cpp Vulkan`, () => runLlamaCpp({
          ...workload, threads: settings.threads, gpu: 'vulkan', out: join(raw, `${key}-llama-cpp-vulkan.json`),
        }));
      }
    }
  }
  return entries;
}

/** The parts of `entries` that failed, as names for the run's exit status. */
export function failedSizes(entries) {
  const failed = [];
  for (const e of entries ?? []) {
    const name = `${e.size} ${e.type}`;
    if (e.error) failed.push(`${name} file`);
    e.rounds.forEach((r, i) => {
      if (r.kestrel_cpu?.error) failed.push(`${name} Kestrel CPU round ${i + 1}`);
      if (r.llama_cpp?.error) failed.push(`${name} llama.cpp round ${i + 1}`);
    });
    for (const part of ['kestrel_batch', 'kestrel_gpu', 'llama_cpp_vulkan']) if (e[part]?.error) failed.push(`${name} ${part}`);
  }
  return failed;
}
