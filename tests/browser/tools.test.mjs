// Tool calls in the page, on the CPU backend (wasm SIMD) and on WebGPU (SwiftShader): a required
// call names the tool and its arguments validate against the tool's parameters (Ajv); streamed,
// the call arrives as `delta.tool_calls` and none of it as content; the round trip (the call, the
// tool's result, then an answer in text) runs through the model's template. On WebGPU the model is
// the random-weight qwen3 (4 layers of 256): SwiftShader prefills the default model's 30 layers at
// about a token a second, and the tools' prompt is 197 tokens; what differs on the GPU (the mask
// goes up, only the token comes back) is the same for any model.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import Ajv from 'ajv';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, openTestPage, serveAndLaunch } from './harness.mjs';

const MODEL_ON = { cpu: MODEL_URL, webgpu: '/models/synthetic-qwen3-f32.gguf' };

const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 30 } }, required: ['city'], additionalProperties: false },
  },
}];

describe('Tool calls in Chromium', { timeout: 30 * MINUTES }, () => {
  const env = serveAndLaunch();

  for (const backend of ['cpu', 'webgpu']) {
    test(`(${backend}) a required call is valid, streams as delta.tool_calls, and its result round-trips`, { timeout: 20 * MINUTES }, async () => {
      const page = await openTestPage(env.browser.context, env.server.url);
      page.setDefaultTimeout(15 * MINUTES);
      const out = await page.evaluate(async ({ model, backend, contextLength, tools }) => {
        const engine = await window.kestrel.createEngine({ model, backend, context_length: contextLength });
        const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
        // One call each: a random-weight model would go on calling until max_tokens.
        const whole = await engine.chat.completions.create({ messages, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 0, max_tokens: 120 });
        let content = '';
        let finish = null;
        const deltas = [];
        const stream = await engine.chat.completions.create({
          messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 1, seed: 4, max_tokens: 120, stream: true,
        });
        for await (const chunk of stream) {
          content += chunk.choices[0]?.delta?.content ?? '';
          deltas.push(...(chunk.choices[0]?.delta?.tool_calls ?? []));
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        const message = whole.choices[0].message;
        const call = message.tool_calls?.[0];
        const followUp = [...messages, message, { role: 'tool', tool_call_id: call?.id, content: '{"temperature": 18}' }];
        const answer = await engine.chat.completions.create({ messages: followUp, tools, tool_choice: 'none', temperature: 0, max_tokens: 8 });
        await engine.unload();
        return { whole: whole.choices[0], content, finish, deltas, answer: answer.choices[0] };
      }, { model: MODEL_ON[backend], backend, contextLength: CONTEXT_LENGTH, tools: TOOLS });
      console.log(`${backend}: ${JSON.stringify(out.whole.message.tool_calls)} / ${JSON.stringify(out.deltas)} / ${JSON.stringify(out.answer.message)}`);
      const validate = new Ajv({ strict: false }).compile(TOOLS[0].function.parameters);
      assert.equal(out.whole.finish_reason, 'tool_calls');
      assert.equal(out.whole.message.content, null);
      for (const call of [...out.whole.message.tool_calls, ...out.deltas]) {
        assert.equal(call.type, 'function');
        assert.equal(call.function.name, 'get_weather');
        assert.ok(validate(JSON.parse(call.function.arguments)), JSON.stringify(validate.errors));
      }
      assert.equal(out.deltas.length, 1, 'a named tool is called once');
      assert.equal(out.deltas[0].index, 0);
      assert.equal(out.finish, 'tool_calls');
      assert.equal(out.content, '', 'a call is not streamed as content');
      assert.ok(out.answer.message.content.length > 0, 'the answer after the tool result is text');
      assert.equal(out.answer.message.tool_calls, undefined);
      await page.close();
    });
  }
});
