// Will it fit, before the download: `estimate()` reads only the GGUF header (HTTP range requests,
// or the start of the body where the host ignores ranges, or the first bytes of a Blob), and
// `createEngine` refuses a model that does not fit with `device_limits` before fetching weights.
import assert from 'node:assert/strict';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startServer } from '../../www/serve.mjs';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, ROOT, launch, openTestPage } from './harness.mjs';

const SIZE = statSync(join(ROOT, MODEL_URL)).size;
const modelRequests = (server) => server.log.filter((r) => r.path === MODEL_URL);

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
