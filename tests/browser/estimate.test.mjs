// Will it fit, before the download: `estimate()` reads only the GGUF header (HTTP range requests,
// or the start of the body where the host ignores ranges, or the first bytes of a Blob), and
// `createEngine` refuses a model that does not fit with `device_limits` before fetching weights.
import assert from 'node:assert/strict';
import { mkdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startServer } from '../../www/serve.mjs';
import { ARTIFACTS, CONTEXT_LENGTH, MINUTES, MODEL_URL, ROOT, launch, openTestPage } from './harness.mjs';

const SIZE = statSync(join(ROOT, MODEL_URL)).size;
const modelRequests = (server) => server.log.filter((r) => r.path === MODEL_URL);

// GGUF's metadata value types and ggml's tensor types (their numbers in the GGUF format), with
// the weights per block and bytes per block of the tensor types.
const VALUE = { U32: 4, F32: 6, STRING: 8 };
const TYPE = { F32: { id: 0, block: 1, bytes: 4 }, Q4_K: { id: 12, block: 256, bytes: 144 }, Q6_K: { id: 14, block: 256, bytes: 210 } };

/** Llama 3.1 8B's shapes, Q4_K matrices and a Q6_K embedding (as in its Q4_K_M files): 4.36 GB. */
const LLAMA_8B = { name: 'llama 8b shapes', layers: 32, hidden: 4096, ffn: 14336, heads: 32, kvHeads: 8, vocab: 128256, matrix: TYPE.Q4_K, embedding: TYPE.Q6_K };

/**
 * The header of a GGUF file of a Llama-shaped model (its metadata and tensor descriptors, padded
 * to where the data would start) and none of its data: all an estimate reads, so it stands for
 * the whole file without writing gigabytes.
 */
function llamaHeader({ name, layers, hidden, ffn, heads, kvHeads, vocab, matrix, embedding }) {
  const parts = [];
  const u32 = (v) => parts.push(Buffer.from(new Uint32Array([v]).buffer));
  const u64 = (v) => parts.push(Buffer.from(new BigUint64Array([BigInt(v)]).buffer));
  const f32 = (v) => parts.push(Buffer.from(new Float32Array([v]).buffer));
  const string = (s) => {
    const bytes = Buffer.from(s, 'utf8');
    u64(bytes.length);
    parts.push(bytes);
  };
  const metadata = [
    ['general.architecture', VALUE.STRING, 'llama'],
    ['general.name', VALUE.STRING, name],
    ['llama.context_length', VALUE.U32, 8192],
    ['llama.embedding_length', VALUE.U32, hidden],
    ['llama.feed_forward_length', VALUE.U32, ffn],
    ['llama.block_count', VALUE.U32, layers],
    ['llama.attention.head_count', VALUE.U32, heads],
    ['llama.attention.head_count_kv', VALUE.U32, kvHeads],
    ['llama.rope.freq_base', VALUE.F32, 500000],
    ['llama.attention.layer_norm_rms_epsilon', VALUE.F32, 1e-5],
    ['llama.vocab_size', VALUE.U32, vocab],
  ];
  const kv = (hidden / heads) * kvHeads;
  // ggml's dims: the row length first.
  const tensors = [['token_embd.weight', [hidden, vocab], embedding]];
  for (let l = 0; l < layers; l++) {
    tensors.push(
      [`blk.${l}.attn_norm.weight`, [hidden], TYPE.F32],
      [`blk.${l}.attn_q.weight`, [hidden, hidden], matrix],
      [`blk.${l}.attn_k.weight`, [hidden, kv], matrix],
      [`blk.${l}.attn_v.weight`, [hidden, kv], matrix],
      [`blk.${l}.attn_output.weight`, [hidden, hidden], matrix],
      [`blk.${l}.ffn_norm.weight`, [hidden], TYPE.F32],
      [`blk.${l}.ffn_gate.weight`, [hidden, ffn], matrix],
      [`blk.${l}.ffn_up.weight`, [hidden, ffn], matrix],
      [`blk.${l}.ffn_down.weight`, [ffn, hidden], matrix],
    );
  }
  tensors.push(['output_norm.weight', [hidden], TYPE.F32]);
  parts.push(Buffer.from('GGUF'));
  u32(3);
  u64(tensors.length);
  u64(metadata.length);
  for (const [key, type, value] of metadata) {
    string(key);
    u32(type);
    ({ [VALUE.U32]: u32, [VALUE.F32]: f32, [VALUE.STRING]: string })[type](value);
  }
  // Each tensor's data at a multiple of 32 bytes (GGUF's default alignment).
  let offset = 0;
  for (const [tensor, dims, type] of tensors) {
    string(tensor);
    u32(dims.length);
    dims.forEach(u64);
    u32(type.id);
    u64(offset);
    const bytes = (dims.reduce((a, b) => a * b, 1) / type.block) * type.bytes;
    offset += Math.ceil(bytes / 32) * 32;
  }
  const header = Buffer.concat(parts);
  return Buffer.concat([header, Buffer.alloc((32 - (header.length % 32)) % 32)]);
}

/** `createEngine(options)` on the test page: null if it resolves, else the error's code and message. */
function refusal(page, options) {
  return page.evaluate(async (options) => {
    try {
      const engine = await window.kestrel.createEngine(options);
      await engine.unload();
      return null;
    } catch (err) {
      return { code: err.code, message: err.message };
    }
  }, options);
}

test('estimate() answers from the header alone and createEngine refuses what does not fit', { timeout: 20 * MINUTES }, async () => {
  const ranged = await startServer();
  const whole = await startServer({ ranges: false });
  const browser = await launch();
  try {
    const page = await openTestPage(browser.context, ranged.url);
    page.setDefaultTimeout(15 * MINUTES);
    const estimateOn = (model, contextLength, on = page, kvCache = undefined) =>
      on.evaluate(({ model, contextLength, kvCache }) => window.kestrel.estimate({ model, context_length: contextLength, kv_cache: kvCache }), { model, contextLength, kvCache });

    const e = await estimateOn(MODEL_URL, CONTEXT_LENGTH);
    console.log('estimate:', JSON.stringify(e));
    assert.equal(e.fits, true, e.reason);
    assert.equal(e.file_bytes, SIZE);
    assert.equal(e.arch, 'llama');
    assert.equal(e.context_length, CONTEXT_LENGTH);
    // SmolLM2-135M: 30 layers, 3 KV heads of 64 dimensions, f16 K and V by default.
    assert.equal(e.kv_cache_bytes, 2 * 30 * 3 * CONTEXT_LENGTH * 64 * 2);
    const f32 = await estimateOn(MODEL_URL, CONTEXT_LENGTH, page, 'f32');
    assert.equal(f32.kv_cache_bytes, 2 * e.kv_cache_bytes);
    const badKv = await page.evaluate((model) => window.kestrel.estimate({ model, kv_cache: 'f8' }).then(() => null, (err) => err.code), MODEL_URL);
    assert.equal(badKv, 'invalid_option');
    assert.deepEqual(e.unsupported, []);
    assert.ok(e.largest_binding.bytes <= e.limits.maxStorageBufferBindingSize);
    const fetched = modelRequests(ranged);
    assert.ok(fetched.length >= 1 && fetched.every((r) => r.range), `only range requests: ${JSON.stringify(fetched)}`);

    // A host without ranges: the start of the body, then the download is stopped.
    const viaWhole = await estimateOn(MODEL_URL, CONTEXT_LENGTH, await openTestPage(browser.context, whole.url));
    assert.deepEqual({ ...viaWhole, limits: null }, { ...e, limits: null });
    // The first bytes of a File or Blob.
    const viaBlob = await page.evaluate(async ({ url, contextLength }) => {
      const head = await (await fetch(url, { headers: { Range: 'bytes=0-4194303' } })).blob();
      return window.kestrel.estimate({ model: head, context_length: contextLength });
    }, { url: MODEL_URL, contextLength: CONTEXT_LENGTH });
    assert.equal(viaBlob.weight_bytes, e.weight_bytes);

    // A KV cache whose layer buffer exceeds the binding limit: refused before the download.
    const kvLayerBytesPerToken = 3 * 64 * 2;
    const huge = Math.ceil(Math.min(e.limits.maxStorageBufferBindingSize, e.limits.maxBufferSize) / kvLayerBytesPerToken) + 1;
    const big = await estimateOn(MODEL_URL, huge);
    assert.equal(big.fits, false);
    assert.equal(big.code, 'device_limits');
    const before = modelRequests(ranged).length;
    const refused = await page.evaluate(async ({ model, huge }) => {
      try {
        await window.kestrel.createEngine({ model, context_length: huge });
        return null;
      } catch (err) {
        return { code: err.code, message: err.message };
      }
    }, { model: MODEL_URL, huge });
    console.log('refused:', JSON.stringify(refused));
    assert.equal(refused?.code, 'device_limits');
    assert.match(refused.message, /\d+-byte buffer; this device binds at most \d+ bytes/);
    assert.ok(modelRequests(ranged).slice(before).every((r) => r.range), 'no weight was downloaded');

    // Slots multiply the KV cache (one per sequence, a layer's K of every slot in one buffer): a
    // context that fits one slot is refused for 16 on WebGPU, again before the download.
    const slotsOf = (slots, contextLength) =>
      page.evaluate(({ model, slots, contextLength }) => window.kestrel.estimate({ model, slots, context_length: contextLength }), { model: MODEL_URL, slots, contextLength });
    const four = await slotsOf(4, CONTEXT_LENGTH);
    assert.equal(four.slots, 4);
    assert.equal(four.kv_cache_bytes, 4 * e.kv_cache_bytes);
    const badSlots = await page.evaluate((model) => window.kestrel.estimate({ model, slots: 2.5 }).then(() => null, (err) => err.code), MODEL_URL);
    assert.equal(badSlots, 'invalid_option');
    const perSlot = Math.ceil(huge / 16);
    assert.equal((await slotsOf(1, perSlot)).fits, true);
    assert.equal((await slotsOf(16, perSlot)).code, 'device_limits');
    const beforeSlots = modelRequests(ranged).length;
    const refusedSlots = await page.evaluate(async ({ model, perSlot }) => {
      try {
        await window.kestrel.createEngine({ model, backend: 'webgpu', context_length: perSlot, slots: 16 });
        return null;
      } catch (err) {
        return { code: err.code, message: err.message };
      }
    }, { model: MODEL_URL, perSlot });
    assert.equal(refusedSlots?.code, 'device_limits', JSON.stringify(refusedSlots));
    assert.match(refusedSlots.message, /16 slots/);
    assert.ok(modelRequests(ranged).slice(beforeSlots).every((r) => r.range), 'no weight was downloaded');

    // What fits loads, and the estimate's weight bytes are what the engine put on the GPU.
    const info = await page.evaluate(async ({ model, contextLength }) => {
      const engine = await window.kestrel.createEngine({ model, context_length: contextLength });
      const info = engine.info;
      await engine.unload();
      return info;
    }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
    assert.equal(info.model.weight_bytes, e.weight_bytes);
  } finally {
    await browser.close();
    await whole.close();
    await ranged.close();
  }
});

test('the verdicts weigh the total: the GPU against what it can hold, the CPU backend against 32-bit wasm memory, before any weight is fetched', { timeout: 20 * MINUTES }, async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  writeFileSync(join(ARTIFACTS, 'llama-8b-header.gguf'), llamaHeader(LLAMA_8B));
  const BIG_URL = '/tests/artifacts/llama-8b-header.gguf';
  const server = await startServer();
  const browser = await launch();
  try {
    const page = await openTestPage(browser.context, server.url);
    page.setDefaultTimeout(15 * MINUTES);
    const requestsOf = (path) => server.log.filter((r) => r.path === path);
    const estimateOf = (options) => page.evaluate((options) => window.kestrel.estimate(options), options);

    // Issue 41: 16 slots of 32768 f32 positions. No layer's buffer exceeds the adapter's 1 GiB
    // bindings, but the whole does not fit: the total decides, and the reason names it.
    const hugeCache = { model: MODEL_URL, context_length: 32768, slots: 16, kv_cache: 'f32' };
    const huge = await estimateOf(hugeCache);
    console.log('16 x 32768 f32:', JSON.stringify({ ...huge, unsupported: undefined }));
    assert.equal(huge.kv_cache_bytes, 24_159_191_040);
    assert.equal(huge.total_bytes, huge.weight_bytes + huge.kv_cache_bytes + huge.activation_bytes);
    assert.ok(huge.largest_binding.bytes <= Math.min(huge.limits.maxBufferSize, huge.limits.maxStorageBufferBindingSize), 'within the bindings');
    assert.equal(huge.fits, false);
    assert.equal(huge.code, 'device_limits');
    assert.ok(['device_memory', 'default'].includes(huge.memory_limit.source), huge.memory_limit.source);
    assert.ok(huge.total_bytes > huge.memory_limit.bytes);
    for (const number of [huge.total_bytes, huge.kv_cache_bytes, huge.memory_limit.bytes]) assert.ok(huge.reason.includes(String(number)), `${number} in ${huge.reason}`);
    // The CPU backend cannot hold it either.
    assert.equal(huge.cpu.fits, false);
    assert.equal(huge.cpu.code, 'device_limits');
    assert.deepEqual(huge.cpu.memory_limit, { bytes: 2 ** 32, source: 'wasm32' });
    assert.ok(huge.cpu.reason.includes(String(huge.cpu.bytes)), huge.cpu.reason);

    // createEngine refuses it before the download: on WebGPU with the GPU's numbers; with 'auto'
    // (the CPU backend here, SwiftShader being a software adapter) with the CPU backend's.
    for (const [backend, bytes] of [['webgpu', huge.total_bytes], ['auto', huge.cpu.bytes]]) {
      const before = requestsOf(MODEL_URL).length;
      const refused = await refusal(page, { ...hugeCache, backend });
      console.log(`refused (${backend}):`, JSON.stringify(refused));
      assert.equal(refused?.code, 'device_limits', JSON.stringify(refused));
      assert.ok(refused.message.includes(String(bytes)), refused.message);
      assert.ok(requestsOf(MODEL_URL).slice(before).every((r) => r.range), 'no weight was downloaded');
    }
    // With `remote`, the page gets the remote engine instead (nothing is sent until a request).
    const viaRemote = await page.evaluate(async (options) => {
      const engine = await window.kestrel.createEngine({ ...options, backend: 'auto', remote: { baseURL: 'http://127.0.0.1:9/v1' } });
      const info = engine.info;
      await engine.unload();
      return info;
    }, hugeCache);
    assert.equal(viaRemote.backend, 'remote');
    assert.equal(viaRemote.fallback.code, 'device_limits');

    // Issue 35: an 8B model (its header alone, served as the file) is past 32-bit wasm memory.
    const big = await estimateOf({ model: BIG_URL });
    console.log('8B:', JSON.stringify({ ...big, unsupported: undefined }));
    assert.equal(big.cpu.fits, false);
    assert.equal(big.cpu.code, 'device_limits');
    assert.ok(big.cpu.weight_bytes > 2 ** 32 && big.cpu.bytes === big.cpu.weight_bytes + big.cpu.kv_cache_bytes + big.cpu.scratch_bytes + big.cpu.engine_bytes);
    for (const number of [big.cpu.bytes, big.cpu.weight_bytes, 2 ** 32]) assert.ok(big.cpu.reason.includes(String(number)), `${number} in ${big.cpu.reason}`);
    // A GPU holds it where it has the memory: its bindings fit, the total is 4.9 GB.
    assert.equal(big.fits, big.total_bytes <= big.memory_limit.bytes, big.reason);
    // 'auto' on a software adapter and 'cpu' refuse it with device_limits, having read only the
    // header: from a URL (range requests) and from a File.
    for (const backend of ['auto', 'cpu']) {
      const before = requestsOf(BIG_URL).length;
      const refused = await refusal(page, { model: BIG_URL, backend });
      assert.equal(refused?.code, 'device_limits', JSON.stringify(refused));
      assert.ok(refused.message.includes(String(big.cpu.bytes)), refused.message);
      assert.ok(requestsOf(BIG_URL).slice(before).every((r) => r.range), 'only the header was read');
    }
    const fromFile = await page.evaluate(async (url) => {
      const file = new File([await (await fetch(url)).blob()], 'llama-8b.gguf');
      try {
        await window.kestrel.createEngine({ model: file, backend: 'auto' });
        return null;
      } catch (err) {
        return { code: err.code, message: err.message };
      }
    }, BIG_URL);
    assert.equal(fromFile?.code, 'device_limits', JSON.stringify(fromFile));

    // What fits loads on the CPU backend within its estimate: its matrices are the estimate's
    // weights less the norm vectors (61 of 576 f32 values), and the worker's wasm memory after
    // the load and a generation is at most the estimate, and at least the weights and KV cache.
    const cpuRun = await page.evaluate(async ({ model, contextLength }) => {
      const { cpu } = await window.kestrel.estimate({ model, context_length: contextLength });
      const engine = await window.kestrel.createEngine({ model, backend: 'cpu', context_length: contextLength });
      await engine.completions.create({ prompt: 'The capital of France is', max_tokens: 8 });
      const memory = await engine.memory();
      const matrices = engine.info.model.weight_bytes;
      await engine.unload();
      return { cpu, matrices, wasm: memory.wasm_bytes };
    }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
    console.log('CPU backend:', JSON.stringify(cpuRun));
    assert.equal(cpuRun.cpu.fits, true);
    assert.equal(cpuRun.matrices, cpuRun.cpu.weight_bytes - 61 * 576 * 4);
    assert.ok(cpuRun.wasm <= cpuRun.cpu.bytes, `wasm memory ${cpuRun.wasm} > the estimate ${cpuRun.cpu.bytes}`);
    assert.ok(cpuRun.wasm >= cpuRun.cpu.weight_bytes + cpuRun.cpu.kv_cache_bytes, `wasm memory ${cpuRun.wasm} below the weights and cache`);
  } finally {
    await browser.close();
    await server.close();
  }
});
