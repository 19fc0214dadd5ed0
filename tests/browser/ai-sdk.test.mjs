// The Vercel AI SDK provider (www/ai-sdk.js) in the page, driven by the real `ai` package (ai 7;
// tests/ai-sdk runs the provider under ai 5, 6 and 7), bundled with esbuild together with the
// provider, which reads `ai`'s version from its package.json, as an app's bundler would:
// generateText and streamText give the greedy text of the package's own
// chat.completions.create on the same messages; a tool call comes back as the SDK's tool call
// with arguments valid against the tool's zod schema (and Ajv on its JSON Schema); Output.object
// and Output.json give valid JSON; availability() answers from the estimate before the lazy load
// and 'available' after it; an aborted streamText stops the engine's generation. CPU backend.
import assert from 'node:assert/strict';
import { join, relative, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import Ajv from 'ajv';
import { build } from 'esbuild';
import { ARTIFACTS, CONTEXT_LENGTH, MINUTES, MODEL_URL, openTestPage, serveAndLaunch } from './harness.mjs';

const BUNDLE = '/tests/artifacts/ai-sdk/ai.js';
const WWW = join(import.meta.dirname, '../../www');

/**
 * An esbuild plugin that leaves the rest of the package out of the bundle: the provider's imports
 * of the package's other modules load unbundled from /www, where the engine and its worker are
 * (and where the other tests load them from).
 */
const packageFromWww = {
  name: 'package-from-www',
  setup(build) {
    build.onResolve({ filter: /^\.\.?\// }, ({ path, importer, resolveDir }) => {
      if (!importer.startsWith(`${WWW}/`)) return undefined;
      return { path: `/www/${relative(WWW, resolve(resolveDir, path))}`, external: true };
    });
  },
};

describe('Vercel AI SDK provider in Chromium', { timeout: 20 * MINUTES }, () => {
  const env = serveAndLaunch();
  let page;

  before(async () => {
    // The SDK, zod and the provider for the page; `ai` resolves from this folder's node_modules.
    await build({
      stdin: {
        contents: `export { generateText, streamText, Output, tool, NoSuchModelError } from 'ai'; export { z } from 'zod'; export { createKestrel } from ${JSON.stringify(join(WWW, 'ai-sdk.js'))};`,
        resolveDir: import.meta.dirname,
      },
      bundle: true, format: 'esm', platform: 'browser', target: 'es2022', outfile: join(ARTIFACTS, 'ai-sdk/ai.js'), logLevel: 'warning',
      nodePaths: [join(import.meta.dirname, 'node_modules')], plugins: [packageFromWww],
    });
    page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(10 * MINUTES);
    await page.evaluate(async (bundle) => {
      globalThis.AI_SDK_LOG_WARNINGS = false; // the tests read warnings from the results
      window.ai = await import(bundle);
      window.createKestrel = window.ai.createKestrel;
    }, BUNDLE);
  });
  after(() => page?.close());

  test('availability answers before the load, the engine loads once on first use, bad settings are clear errors', async () => {
    const out = await page.evaluate(async ({ model, contextLength }) => {
      const phases = [];
      const kestrel = window.createKestrel({ model, backend: 'cpu', context_length: contextLength, onProgress: (p) => phases.push(p.phase) });
      const before = await kestrel.availability();
      const phasesBefore = phases.length;
      const models = [kestrel(), kestrel.languageModel('smol')];
      const loading = kestrel.engine();
      const during = await kestrel.availability();
      const engine = await loading;
      const after = await kestrel.availability();
      const shared = (await kestrel.engine()) === engine;
      // 2^20 positions of KV cache: far past 32-bit wasm's 4 GiB.
      const tooBig = await window.createKestrel({ model, backend: 'cpu', context_length: 1 << 20 }).availability();
      const given = await window.createKestrel({ engine }).availability();
      const errors = [];
      try { kestrel.embeddingModel('e5'); } catch (e) { errors.push(window.ai.NoSuchModelError.isInstance(e) && e.modelType); }
      for (const settings of [{}, { engine: {} }, { engine, model }]) {
        try { window.createKestrel(settings); } catch (e) { errors.push(e.code); }
      }
      window.provider = kestrel;
      window.engine = engine;
      return {
        before: { status: before.status, cpuFits: before.estimate?.cpu.fits }, phasesBefore, phases: [...new Set(phases)],
        during, after, shared, tooBig: { status: tooBig.status, code: tooBig.code, reason: tooBig.reason }, given, errors,
        ids: models.map((m) => [m.specificationVersion, m.provider, m.modelId]),
      };
    }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
    console.log(JSON.stringify(out));
    assert.deepEqual(out.before, { status: 'downloadable', cpuFits: true });
    assert.equal(out.phasesBefore, 0, 'availability() downloads nothing');
    assert.deepEqual(out.during, { status: 'downloading' });
    assert.deepEqual(out.after, { status: 'available' });
    assert.ok(out.phases.includes('download') && out.phases.includes('ready'), `progress phases: ${out.phases}`);
    assert.ok(out.shared, 'one engine for the provider');
    assert.equal(out.tooBig.status, 'unavailable');
    assert.equal(out.tooBig.code, 'device_limits');
    assert.match(out.tooBig.reason, /\d/);
    assert.deepEqual(out.given, { status: 'available' });
    assert.deepEqual(out.errors, ['embeddingModel', 'invalid_option', 'invalid_option', 'invalid_option']);
    assert.deepEqual(out.ids, [['v4', 'kestrel', 'SmolLM2-135M-Instruct.Q4_1.gguf'], ['v4', 'kestrel', 'smol']]);
  });

  test('generateText and streamText give the greedy text of chat.completions.create; tool history and warnings', async () => {
    const out = await page.evaluate(async () => {
      const { ai, provider: kestrel, engine } = window;
      const direct = (messages, max_tokens) => engine.chat.completions.create({ messages, max_tokens, temperature: 0 }).then((r) => ({ text: r.choices[0].message.content, usage: r.usage, finish: r.choices[0].finish_reason }));
      const messages = [{ role: 'system', content: 'You are a poet.' }, { role: 'user', content: 'Write about the sea.' }];
      const expected = await direct(messages, 12);
      const generated = await ai.generateText({ model: kestrel(), instructions: messages[0].content, prompt: messages[1].content, maxOutputTokens: 12, temperature: 0 });
      const streamed = ai.streamText({ model: kestrel(), instructions: messages[0].content, messages: [{ role: 'user', content: messages[1].content }], maxOutputTokens: 12, temperature: 0, include: { rawChunks: true } });
      const types = [];
      let deltas = '';
      const raw = [];
      for await (const part of streamed.fullStream) {
        types.push(part.type);
        if (part.type === 'text-delta') deltas += part.text;
        if (part.type === 'raw') raw.push(part.rawValue);
      }
      // A finished tool round trip in the history: the call and its result through the template.
      const history = [
        { role: 'user', content: 'What is the weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temperature":18}' },
      ];
      const historyExpected = await direct(history, 8);
      const historyGenerated = await ai.generateText({
        model: kestrel(), maxOutputTokens: 8, temperature: 0,
        messages: [
          { role: 'user', content: 'What is the weather in Paris?' },
          { role: 'assistant', content: [{ type: 'tool-call', toolCallId: 'call_1', toolName: 'get_weather', input: { city: 'Paris' } }] },
          { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call_1', toolName: 'get_weather', output: { type: 'json', value: { temperature: 18 } } }] },
        ],
      });
      // A file part: left out with a warning, the text kept.
      const fileExpected = await direct([{ role: 'user', content: 'Summarize this.' }], 4);
      const withFile = await ai.generateText({
        model: kestrel(), maxOutputTokens: 4, temperature: 0,
        messages: [{ role: 'user', content: [{ type: 'text', text: 'Summarize this.' }, { type: 'file', data: new TextEncoder().encode('abc'), mediaType: 'text/plain' }] }],
      });
      const conflict = await ai.generateText({ model: kestrel(), prompt: 'x', temperature: 0, providerOptions: { kestrel: { temperature: 1 } }, maxRetries: 0 }).then(() => null, (e) => e.code ?? e.cause?.code ?? e.message);
      return {
        expected, generated: { text: generated.text, usage: generated.usage, finish: generated.finishReason, raw: generated.rawFinishReason, warnings: generated.warnings, timings: generated.providerMetadata?.kestrel?.timings },
        streamed: { text: await streamed.text, deltas, usage: await streamed.usage, finish: await streamed.finishReason, types: [...new Set(types)], raw: { objects: [...new Set(raw.map((c) => c.object))], finish: raw.at(-1)?.choices[0]?.finish_reason } },
        historyExpected, history: historyGenerated.text, fileExpected, withFile: { text: withFile.text, warnings: withFile.warnings }, conflict,
      };
    });
    console.log(JSON.stringify(out));
    assert.ok(out.expected.text.length > 0);
    assert.equal(out.generated.text, out.expected.text);
    assert.equal(out.streamed.text, out.expected.text);
    assert.equal(out.streamed.deltas, out.expected.text);
    for (const got of [out.generated, out.streamed]) {
      assert.equal(got.usage.inputTokens, out.expected.usage.prompt_tokens);
      assert.equal(got.usage.outputTokens, out.expected.usage.completion_tokens);
      assert.equal(got.finish, 'length');
    }
    assert.equal(out.generated.raw, 'length');
    assert.deepEqual(out.generated.warnings, []);
    assert.equal(out.generated.timings.decode_tokens + 1, out.expected.usage.completion_tokens, 'Kestrel\'s timings in providerMetadata.kestrel');
    assert.deepEqual(out.streamed.raw, { objects: ['chat.completion.chunk'], finish: 'length' }, 'rawChunks: Kestrel\'s chunks');
    for (const type of ['start', 'start-step', 'text-start', 'text-delta', 'text-end', 'finish-step', 'finish']) assert.ok(out.streamed.types.includes(type), `${type} in ${out.streamed.types}`);
    assert.ok(out.historyExpected.text.length > 0);
    assert.equal(out.history, out.historyExpected.text);
    assert.equal(out.withFile.text, out.fileExpected.text);
    assert.deepEqual(out.withFile.warnings.map((w) => [w.type, w.feature]), [['unsupported', 'file part in a user message']]);
    assert.equal(out.conflict, 'invalid_option');
  });

  test('doGenerate maps every prompt part to Kestrel\'s messages and warns of what it leaves out', async () => {
    const out = await page.evaluate(async () => {
      const { provider: kestrel } = window;
      const result = await kestrel().doGenerate({
        maxOutputTokens: 1, temperature: 0, topP: 0.9, topK: 5, seed: 7, presencePenalty: 0.5, frequencyPenalty: 0.25, stopSequences: ['END'],
        reasoning: 'high', headers: { 'user-agent': 'ai/7', 'x-trace': '1' },
        tools: [
          { type: 'function', name: 'lookup', description: 'Looks up.', inputSchema: { type: 'object' }, inputExamples: [{ input: { q: 'x' } }] },
          { type: 'provider', id: 'other.search', name: 'search', args: {} },
        ],
        toolChoice: { type: 'tool', toolName: 'lookup' },
        prompt: [
          { role: 'system', content: 'Be brief.' },
          { role: 'user', content: [{ type: 'text', text: 'Find ' }, { type: 'text', text: 'cats.' }] },
          { role: 'assistant', content: [{ type: 'reasoning', text: 'hmm' }, { type: 'text', text: 'Looking.' }, { type: 'tool-call', toolCallId: 'a', toolName: 'lookup', input: { q: 'cats' } }, { type: 'tool-call', toolCallId: 'b', toolName: 'lookup', input: { q: 'dogs' } }] },
          { role: 'tool', content: [
            { type: 'tool-result', toolCallId: 'a', toolName: 'lookup', output: { type: 'text', value: 'many' } },
            { type: 'tool-result', toolCallId: 'b', toolName: 'lookup', output: { type: 'content', value: [{ type: 'text', text: 'few' }, { type: 'file', data: { type: 'url', url: 'https://x/y.png' }, mediaType: 'image/png' }] } },
            { type: 'tool-approval-response', approvalId: 'p', approved: true },
          ] },
          { role: 'assistant', content: [{ type: 'tool-call', toolCallId: 'c', toolName: 'lookup', input: {} }] },
          { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'c', toolName: 'lookup', output: { type: 'execution-denied', reason: 'no' } }] },
        ],
      });
      return { request: result.request.body, warnings: result.warnings.map((w) => w.feature), finish: result.finishReason, usage: result.usage.outputTokens.total };
    });
    console.log(JSON.stringify(out));
    const call = (id, q) => ({ id, type: 'function', function: { name: 'lookup', arguments: JSON.stringify(q) } });
    assert.deepEqual(out.request, {
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Find cats.' },
        { role: 'assistant', content: 'Looking.', tool_calls: [call('a', { q: 'cats' }), call('b', { q: 'dogs' })] },
        { role: 'tool', tool_call_id: 'a', content: 'many' },
        { role: 'tool', tool_call_id: 'b', content: 'few' },
        { role: 'assistant', content: null, tool_calls: [call('c', {})] },
        { role: 'tool', tool_call_id: 'c', content: 'no' },
      ],
      max_tokens: 1, temperature: 0, top_p: 0.9, top_k: 5, presence_penalty: 0.5, frequency_penalty: 0.25, seed: 7, stop: ['END'],
      tools: [{ type: 'function', function: { name: 'lookup', description: 'Looks up.', parameters: { type: 'object' } } }],
      tool_choice: { type: 'function', function: { name: 'lookup' } },
    });
    assert.deepEqual(out.warnings.sort(), [
      'file part in a tool result', 'headers', 'inputExamples of tool lookup', 'provider tool search',
      'reasoning', 'reasoning part in an assistant message', 'tool-approval-response part in a tool message',
    ]);
    assert.equal(out.usage, 1, 'the engine ran the request');
  });

  test('a tool call comes back as the SDK\'s tool call, valid against its zod schema, whole and streamed', async () => {
    const out = await page.evaluate(async () => {
      const { ai, provider: kestrel, engine } = window;
      const schema = ai.z.object({ city: ai.z.string().max(30) });
      const tools = { get_weather: ai.tool({ description: 'The current weather in a city.', inputSchema: schema }) };
      const prompt = 'What is the weather in Paris?';
      const whole = await ai.generateText({ model: kestrel(), prompt, tools, toolChoice: 'required', temperature: 0, maxOutputTokens: 120, providerOptions: { kestrel: { parallel_tool_calls: false } }, include: { requestBody: true } });
      // The engine's own answer to the request the provider sent.
      const direct = await engine.chat.completions.create(whole.request.body);
      const streamed = ai.streamText({ model: kestrel(), prompt, tools, toolChoice: { type: 'tool', toolName: 'get_weather' }, temperature: 0, maxOutputTokens: 120 });
      const types = [];
      let input = '';
      for await (const part of streamed.fullStream) {
        types.push(part.type);
        if (part.type === 'tool-input-delta') input += part.delta;
      }
      const calls = [...whole.toolCalls, ...(await streamed.toolCalls)];
      return {
        calls: calls.map((c) => ({ type: c.type, name: c.toolName, id: c.toolCallId, input: c.input, invalid: c.invalid ?? false, valid: schema.safeParse(c.input).success })),
        direct: direct.choices[0].message.tool_calls.map((c) => ({ id: c.id, name: c.function.name, input: JSON.parse(c.function.arguments) })),
        sent: { parallel: whole.request.body.parallel_tool_calls, choice: whole.request.body.tool_choice, tools: whole.request.body.tools },
        finish: [whole.finishReason, await streamed.finishReason], text: whole.text, types: [...new Set(types)], input,
        jsonSchema: ai.z.toJSONSchema(schema, { target: 'draft-7' }),
      };
    });
    console.log(JSON.stringify(out));
    assert.equal(out.calls.length, 2);
    const validate = new Ajv({ strict: false }).compile(out.jsonSchema);
    for (const call of out.calls) {
      assert.equal(call.type, 'tool-call');
      assert.equal(call.name, 'get_weather');
      assert.equal(call.invalid, false);
      assert.ok(call.valid, `zod rejects ${JSON.stringify(call.input)}`);
      assert.ok(validate(call.input), JSON.stringify(validate.errors));
    }
    assert.deepEqual(out.direct, [{ id: out.calls[0].id, name: 'get_weather', input: out.calls[0].input }]);
    assert.equal(out.sent.parallel, false);
    assert.equal(out.sent.choice, 'required');
    assert.equal(out.sent.tools[0].function.name, 'get_weather');
    assert.equal(out.sent.tools[0].function.parameters.properties.city.maxLength, 30);
    assert.deepEqual(out.finish, ['tool-calls', 'tool-calls']);
    assert.equal(out.text, '');
    for (const type of ['tool-input-start', 'tool-input-delta', 'tool-input-end', 'tool-call']) assert.ok(out.types.includes(type), `${type} in ${out.types}`);
    assert.deepEqual(JSON.parse(out.input), out.calls[1].input);
  });

  test('Output.object and Output.json give JSON valid against the schema, whole and streamed', async () => {
    const out = await page.evaluate(async () => {
      const { ai, provider: kestrel, engine } = window;
      const schema = ai.z.object({ name: ai.z.string().max(20), age: ai.z.number().int().min(0).max(120) });
      const prompt = 'Invent a person.';
      const whole = await ai.generateText({ model: kestrel(), prompt, output: ai.Output.object({ schema }), temperature: 0, maxOutputTokens: 80, include: { requestBody: true } });
      const streamed = ai.streamText({ model: kestrel(), prompt, output: ai.Output.object({ schema }), temperature: 0, maxOutputTokens: 80 });
      const partials = [];
      for await (const partial of streamed.partialOutputStream) partials.push(partial);
      const final = await streamed.output;
      const json = await ai.generateText({ model: kestrel(), prompt: 'Repeat exactly: {"ok": true}', output: ai.Output.json(), temperature: 0, maxOutputTokens: 60, include: { requestBody: true } });
      const direct = await engine.chat.completions.create(json.request.body);
      return {
        whole: whole.output, wholeValid: schema.safeParse(whole.output).success, format: whole.request.body.response_format,
        final, finalValid: schema.safeParse(final).success, partials: partials.length,
        json: json.output, jsonDirect: JSON.parse(direct.choices[0].message.content), jsonFormat: json.request.body.response_format, jsonSchema: ai.z.toJSONSchema(schema, { target: 'draft-7' }),
      };
    });
    console.log(JSON.stringify(out));
    const validate = new Ajv({ strict: false }).compile(out.jsonSchema);
    for (const value of [out.whole, out.final]) assert.ok(validate(value), JSON.stringify(validate.errors));
    assert.ok(out.wholeValid && out.finalValid);
    assert.deepEqual(out.final, out.whole, 'greedy: the streamed object is the whole one');
    assert.ok(out.partials >= 1);
    assert.equal(out.format.type, 'json_schema');
    assert.equal(out.format.json_schema.schema.properties.age.maximum, 120);
    assert.deepEqual(out.jsonFormat, { type: 'json_object' });
    assert.ok(typeof out.json === 'object' && out.json !== null && !Array.isArray(out.json), 'a JSON object');
    assert.deepEqual(out.json, out.jsonDirect, 'the engine\'s own answer to the request sent');
  });

  test('an aborted streamText stops the generation; an aborted signal rejects at once', async () => {
    const out = await page.evaluate(async () => {
      const { ai, engine } = window;
      // The engine as given to a provider, recording every chunk the engine makes (read ahead of
      // the SDK), so the test sees where the generation itself ended.
      const seen = [];
      let drained = null;
      const watched = {
        info: engine.info,
        unload: () => engine.unload(),
        chat: { completions: { async create(request) {
          const stream = await engine.chat.completions.create(request);
          const queue = [];
          let done = false;
          let wake = () => {};
          drained = (async () => {
            for await (const chunk of stream) { seen.push(chunk); queue.push(chunk); wake(); }
            done = true;
            wake();
          })();
          return (async function* () {
            for (;;) {
              if (queue.length) yield queue.shift();
              else if (done) return;
              else await new Promise((r) => (wake = r));
            }
          })();
        } } },
      };
      const model = window.createKestrel({ engine: watched })();
      const controller = new AbortController();
      const streamed = ai.streamText({
        model, prompt: 'Tell me a long story.', maxOutputTokens: 200, temperature: 0, abortSignal: controller.signal,
        providerOptions: { kestrel: { ignore_eos: true } },
      });
      const types = [];
      let deltas = 0;
      for await (const part of streamed.fullStream) {
        types.push(part.type);
        if (part.type === 'text-delta' && ++deltas === 2) controller.abort();
      }
      await drained;
      const last = seen[seen.length - 1];
      const pre = await ai.generateText({ model, prompt: 'Hi', abortSignal: AbortSignal.abort(), maxRetries: 0 }).then(() => null, (e) => e.name);
      const afterwards = await ai.generateText({ model: window.provider(), prompt: 'Hi', maxOutputTokens: 3, temperature: 0 });
      return { types: [...new Set(types)], deltas, finish: last.choices[0].finish_reason, generated: last.usage.completion_tokens, pre, afterwards: afterwards.usage.outputTokens };
    });
    console.log(JSON.stringify(out));
    assert.ok(out.types.includes('abort'), `abort in ${out.types}`);
    assert.equal(out.finish, 'abort');
    assert.ok(out.generated < 200, `the engine stopped after ${out.generated} tokens`);
    assert.equal(out.pre, 'AbortError');
    assert.equal(out.afterwards, 3, 'the engine serves after the abort');
  });

  test('unload(): a created engine is created again on the next request', async () => {
    const out = await page.evaluate(async () => {
      const { ai, provider: kestrel } = window;
      await kestrel.unload();
      const unloaded = await kestrel.availability();
      const again = await ai.generateText({ model: kestrel(), prompt: 'Hi', maxOutputTokens: 2, temperature: 0 });
      const after = await kestrel.availability();
      await kestrel.unload();
      return { unloaded: unloaded.status, tokens: again.usage.outputTokens, after };
    });
    assert.deepEqual(out, { unloaded: 'downloadable', tokens: 2, after: { status: 'available' } });
  });
});
