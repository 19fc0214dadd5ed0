// The native half of the suite: `kestrel bench model` and its peer, llama.cpp through
// tools/llama-cpp/bench.mjs (node-llama-cpp's prebuilt CPU build), on the same GGUF file, the
// same prompt ids and the same thread count.
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { KESTREL, ROOT } from './paths.mjs';

/** Runs `file args`, its stderr passed through (progress); rejects with the tail of its output on failure. */
export function exec(file, args, env = {}) {
  return new Promise((resolve, reject) => {
    const child = execFile(file, args, { cwd: ROOT, env: { ...process.env, ...env }, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${file.split('/').at(-1)} ${args[0]}: ${err.message.split('\n')[0]}\n${String(stderr).split('\n').slice(-6).join('\n')}`));
      else resolve(stdout);
    });
    child.stderr.on('data', (d) => process.stderr.write(d));
  });
}

const readJson = (path) => JSON.parse(readFileSync(path, 'utf8'));

/** `kestrel bench model` on `backend` ('gpu' or 'cpu'; the CPU backend on `threads` threads);
 * resolves to its JSON. */
export async function runKestrelNative({ model, promptTokens, decodeTokens, repeats, backend, threads, out }) {
  if (!existsSync(KESTREL)) throw new Error(`${KESTREL} is missing: build it with \`cargo build --release -p kestrel-cli\``);
  await exec(KESTREL, ['bench', 'model', '--backend', backend, '--model', model, '--prompt-tokens', promptTokens.join(','), '--decode-tokens', String(decodeTokens), '--repeats', String(repeats), '--json', out],
    { XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR ?? '/tmp', ...(threads ? { RAYON_NUM_THREADS: String(threads) } : {}) });
  return readJson(out);
}

/** `kestrel bench batch` on the CPU backend: decode tok/s of `batchSizes` sequences together and
 * the running sequences' inter-token latency while a prompt of `longPrompt` tokens is admitted. */
export async function runKestrelBatch({ model, decodeTokens, repeats, threads, batchSizes = [1, 2, 4, 8], longPrompt = 512, out }) {
  if (!existsSync(KESTREL)) throw new Error(`${KESTREL} is missing: build it with \`cargo build --release -p kestrel-cli\``);
  await exec(KESTREL, ['bench', 'batch', '--backend', 'cpu', '--model', model, '--batch-sizes', batchSizes.join(','), '--long-prompt', String(longPrompt),
    '--decode-tokens', String(decodeTokens), '--repeats', String(repeats), '--json', out],
    { XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR ?? '/tmp', ...(threads ? { RAYON_NUM_THREADS: String(threads) } : {}) });
  return readJson(out);
}

/** The suite's prompts as text for engines that take text: [{prompt_tokens, round_trips, text}]. */
export async function promptTexts({ model, promptTokens }) {
  return JSON.parse(await exec(KESTREL, ['bench', 'prompt', '--model', model, '--prompt-tokens', promptTokens.join(',')]));
}

/** llama.cpp on `threads` CPU threads, or its Vulkan build with every layer on the GPU (`gpu`:
 * 'vulkan'); resolves to its JSON (schema kestrel-native-peer-bench/1). */
export async function runLlamaCpp({ model, promptTokens, decodeTokens, repeats, threads, gpu, out }) {
  const script = join(ROOT, 'tools/llama-cpp/bench.mjs');
  if (!existsSync(script)) throw new Error('tools/llama-cpp/bench.mjs is missing');
  if (!existsSync(join(ROOT, 'tools/llama-cpp/node_modules'))) throw new Error('tools/llama-cpp has no node_modules: run `npm ci` there');
  await exec(process.execPath, [script, '--model', model, '--threads', String(threads), '--prompt-tokens', promptTokens.join(','),
    '--decode-tokens', String(decodeTokens), '--repeats', String(repeats), '--json', out, ...(gpu ? ['--gpu', gpu] : [])]);
  return readJson(out);
}

/** `kestrel bench constrained`: decode under the JSON Schema `schema` (an id of
 * tests/data/constrained/schemas.json) against free decode of as many tokens, and the mask's
 * host time per token; on `backend` (cpu or gpu). */
export async function runKestrelConstrained({ model, backend, schema, repeats, threads, out }) {
  if (!existsSync(KESTREL)) throw new Error(`${KESTREL} is missing: build it with \`cargo build --release -p kestrel-cli\``);
  await exec(KESTREL, ['bench', 'constrained', '--backend', backend, '--model', model, '--schema', schema, '--repeats', String(repeats), '--json', out],
    { XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR ?? '/tmp', ...(threads ? { RAYON_NUM_THREADS: String(threads) } : {}) });
  return readJson(out);
}

/** llama.cpp's own JSON-schema grammar (node-llama-cpp's createGrammarForJsonSchema) on the same
 * model, schema and threads: the peer of `runKestrelConstrained`. */
export async function runLlamaConstrained({ model, schema, repeats, threads, out }) {
  const script = join(ROOT, 'tools/llama-cpp/constrained.mjs');
  if (!existsSync(join(ROOT, 'tools/llama-cpp/node_modules'))) throw new Error('tools/llama-cpp has no node_modules: run `npm ci` there');
  await exec(process.execPath, [script, '--model', model, '--schema', schema, '--threads', String(threads), '--repeats', String(repeats), '--json', out]);
  return readJson(out);
}

/** `kestrel bench embed` on an embedding model: sentences per second for `inputs` inputs of `tokens`
 * tokens, whose ids it writes to `inputsOut` for the peer to embed the same. */
export async function runKestrelEmbed({ model, inputs, tokens, repeats, threads, inputsOut, out }) {
  if (!existsSync(KESTREL)) throw new Error(`${KESTREL} is missing: build it with \`cargo build --release -p kestrel-cli\``);
  await exec(KESTREL, ['bench', 'embed', '--model', model, '--inputs', String(inputs), '--tokens', String(tokens), '--repeats', String(repeats),
    '--write-inputs', inputsOut, '--json', out], { RAYON_NUM_THREADS: String(threads) });
  return readJson(out);
}

/** llama.cpp's embedding context (node-llama-cpp's getEmbeddingFor, one input a call) on the same
 * model, token ids and threads: the peer of `runKestrelEmbed`. */
export async function runLlamaEmbed({ model, inputsFile, repeats, threads, out }) {
  const script = join(ROOT, 'tools/llama-cpp/embed.mjs');
  if (!existsSync(join(ROOT, 'tools/llama-cpp/node_modules'))) throw new Error('tools/llama-cpp has no node_modules: run `npm ci` there');
  await exec(process.execPath, [script, model, '--bench', inputsFile, '--threads', String(threads), '--repeats', String(repeats), '--json', out]);
  return readJson(out);
}
