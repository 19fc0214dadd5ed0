// Structured output in the page: `response_format` with a JSON Schema, on the CPU backend (wasm
// SIMD) and on WebGPU (SwiftShader), greedy and sampled; every answer parses and validates
// against its schema, checked by Ajv (a validator this project did not write); Kestrel's `regex`
// holds a streamed answer; a bad schema fails with `invalid_option` before any token, and the
// engine keeps serving. On WebGPU the model is the random-weight qwen3 (4 layers of 256), which
// SwiftShader runs many times faster than the default model's 30 layers; the device mask's path is
// the same for any model.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import Ajv from 'ajv';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, openTestPage, ROOT, serveAndLaunch } from './harness.mjs';

/** Schemas of the native suite (tests/data/constrained/schemas.json) without string formats,
 * which Ajv checks only with a plugin. */
const PICKED = ['nested_address', 'any_of', 'refs'];

const MODEL_ON = { cpu: MODEL_URL, webgpu: '/models/synthetic-qwen3-f32.gguf' };

describe('Structured output in Chromium', { timeout: 30 * MINUTES }, () => {
  const env = serveAndLaunch();
  const suite = JSON.parse(readFileSync(join(ROOT, 'tests/data/constrained/schemas.json'), 'utf8')).schemas;
  const cases = suite.filter((c) => PICKED.includes(c.id));

  for (const backend of ['cpu', 'webgpu']) {
    test(`(${backend}) JSON Schema answers validate, a regex holds, a bad schema is invalid_option`, { timeout: 20 * MINUTES }, async () => {
      const page = await openTestPage(env.browser.context, env.server.url);
      page.setDefaultTimeout(15 * MINUTES);
      // On SwiftShader each token is slow: there, one schema, greedy only (the sampled draw
      // under a device mask is checked natively on lavapipe, tests/constrained.rs).
      const runs = backend === 'cpu' ? cases : cases.slice(0, 1);
      const sampling = backend === 'cpu';
      const out = await page.evaluate(async ({ model, backend, contextLength, runs, sampling }) => {
        const engine = await window.kestrel.createEngine({ model, backend, context_length: contextLength });
        const answers = [];
        for (const run of runs) {
          const messages = [{ role: 'system', content: 'Answer in JSON.' }, { role: 'user', content: run.ask }];
          const response_format = { type: 'json_schema', json_schema: { name: run.id, schema: run.schema, strict: true } };
          const greedy = await engine.chat.completions.create({ messages, response_format, temperature: 0, max_tokens: 200 });
          answers.push({ id: run.id, how: 'greedy', text: greedy.choices[0].message.content, finish: greedy.choices[0].finish_reason });
          if (!sampling) continue;
          const sampled = await engine.chat.completions.create({ messages, response_format, temperature: 1, seed: 3, max_tokens: 200 });
          answers.push({ id: run.id, how: 'seed 3', text: sampled.choices[0].message.content, finish: sampled.choices[0].finish_reason });
        }
        let phone = '';
        for await (const chunk of await engine.completions.create({ prompt: 'Call me at', regex: ' [0-9]{3}-[0-9]{4}', temperature: 0, max_tokens: 12, stream: true })) {
          phone += chunk.choices[0]?.text ?? '';
        }
        let tokens = 0;
        const bad = await engine.chat.completions
          .create({ messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'objekt' } } }, stream: true })
          .then(async (stream) => {
            for await (const _ of stream) tokens += 1;
            return null;
          }, (e) => e.code)
          .catch((e) => e.code);
        const after = await engine.completions.create({ prompt: 'Hi', temperature: 0, max_tokens: 2 });
        const info = engine.info;
        await engine.unload();
        return { answers, phone, bad, tokens, after: after.usage.completion_tokens, backend: info.backend };
      }, { model: MODEL_ON[backend], backend, contextLength: CONTEXT_LENGTH, runs, sampling });
      assert.equal(out.backend, backend === 'cpu' ? 'cpu' : 'webgpu');
      const ajv = new Ajv({ strict: false });
      for (const answer of out.answers) {
        console.log(`${backend} ${answer.id} (${answer.how}): ${answer.text}`);
        const schema = cases.find((c) => c.id === answer.id).schema;
        assert.equal(answer.finish, 'stop', `${answer.id} (${answer.how}): cut off`);
        const value = JSON.parse(answer.text);
        const validate = ajv.compile(schema);
        assert.ok(validate(value), `${answer.id} (${answer.how}): ${ajv.errorsText(validate.errors)}`);
      }
      assert.match(out.phone, /^ [0-9]{3}-[0-9]{4}$/);
      assert.equal(out.bad, 'invalid_option');
      assert.equal(out.tokens, 0, 'no token before the error');
      assert.equal(out.after, 2, 'the engine serves the next request');
      await page.close();
    });
  }
});
