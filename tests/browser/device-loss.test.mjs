// A lost GPU device (a driver reset, the browser reclaiming the GPU), twice in a row: the request
// in flight fails with `device_lost`, the engine re-creates the device and reloads the model from
// the Cache API by itself (onStatus reports it), and the next request gives the same tokens.
// On the tiny random-weight qwen3 model: the recovery does not depend on the model, and the
// default one takes seconds per token on SwiftShader.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CONTEXT_LENGTH, MINUTES, openTestPage, serveAndLaunch } from './harness.mjs';

const env = serveAndLaunch();
const MODEL_URL = '/models/synthetic-qwen3-f32.gguf';

test('the engine recovers from a lost device by itself, twice', { timeout: 20 * MINUTES }, async () => {
  const page = await openTestPage(env.browser.context, env.server.url);
  page.setDefaultTimeout(15 * MINUTES);
  const r = await page.evaluate(async ({ model, contextLength }) => {
    const statuses = [];
    const t0 = performance.now();
    const times = [];
    const mark = (what) => times.push(`${what} ${((performance.now() - t0) / 1e3).toFixed(1)}`);
    const engine = await window.kestrel.createEngine({ model, context_length: contextLength, onStatus: (s) => { statuses.push(s.status); mark(s.status); } });
    mark('loaded');
    const ask = async () => (await engine.completions.create({ prompt: 'Paris is', max_tokens: 2, temperature: 0 })).kestrel.token_ids;
    const before = await ask();
    mark('asked');
    const rounds = [];
    for (let round = 0; round < 2; round++) {
      const stream = await engine.completions.create({ prompt: 'Hi', max_tokens: 64, ignore_eos: true, stream: true });
      let pieces = 0;
      let code = null;
      try {
        for await (const chunk of stream) {
          if (chunk.choices[0]?.text && ++pieces === 1) engine._destroyDevice();
        }
      } catch (e) {
        code = e.code;
      }
      mark('failed');
      rounds.push({ code, pieces, after: await ask().catch((e) => `failed: ${e.code} ${JSON.stringify(statuses)}`) });
    }
    const info = engine.info;
    await engine.unload();
    mark('end');
    return { times, before, rounds, statuses, backend: info.backend, model: info.model?.name };
  }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
  console.log('device loss:', JSON.stringify(r));
  for (const round of r.rounds) {
    assert.equal(round.code, 'device_lost', 'the request in flight fails with device_lost');
    assert.ok(round.pieces < 64);
    assert.deepEqual(round.after, r.before, 'the reloaded model gives the same greedy tokens');
  }
  assert.deepEqual(r.statuses, ['device_lost', 'reloading', 'ready', 'device_lost', 'reloading', 'ready']);
  assert.equal(r.backend, 'webgpu');
  assert.ok(r.model);
  await page.close();
});
