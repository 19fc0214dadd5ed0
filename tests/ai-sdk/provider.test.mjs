// The package's own AI SDK provider (www/ai-sdk.js, `createKestrel`) under each `ai` it supports,
// the real packages: ai 5 (`ai5`, which takes LanguageModelV2 models only), ai 6 (`ai6`, V3) and
// ai 7 (`ai`, V4). For each: the model is of the specification that `ai` calls, with no
// compatibility warning; generateText and streamText give the text and token counts of the
// server's own greedy answer; generateObject and streamObject give objects valid against a zod
// schema; a tool call is run by the SDK with arguments valid against the tool's schema, whole and
// streamed; doGenerate writes the finish reason, usage and warnings in the specification's forms.
// An `ai` outside 5-7 is refused with a KestrelError naming both versions.
//
// The provider's engine is `kestrel serve` (CPU backend, the default model, no response cache)
// through a few lines of fetch: the in-page engine's API is OpenAI's, as the server's is. The
// provider finds the installed `ai` by importing `ai/package.json`; ai-versions.mjs points each
// copy of it at one of this folder's three.
import assert from 'node:assert/strict';
import { register } from 'node:module';
import { after, before, describe, test } from 'node:test';
import { z } from 'zod';
import { startKestrelServe } from '../browser/harness.mjs';

register('./ai-versions.mjs', import.meta.url);

const PROVIDER = new URL('../../www/ai-sdk.js', import.meta.url).href;
const VERSIONS = [
  { major: 5, specification: 'v2', sdk: await import('ai5') },
  { major: 6, specification: 'v3', sdk: await import('ai6') },
  { major: 7, specification: 'v4', sdk: await import('ai') },
];

/** What each `ai` logs (AI_SDK_LOG_WARNINGS: ai 5 passes the warnings, ai 6 and 7 `{ warnings }`). */
const logged = [];
globalThis.AI_SDK_LOG_WARNINGS = (arg) => logged.push(...(Array.isArray(arg) ? arg : arg.warnings));

let server;

/**
 * `kestrel serve` as the provider's engine: `chat.completions.create`, whole or as an async
 * iterable of chunks (the usage in the last, as the in-page engine's), with an abort signal.
 */
function serverEngine(baseURL) {
  async function create({ signal, ...request }) {
    const body = { model: 'smollm2', ...request, ...(request.stream && { stream_options: { include_usage: true } }) };
    const response = await fetch(`${baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal });
    if (!response.ok) throw new Error(`kestrel serve answered ${response.status}: ${await response.text()}`);
    return request.stream ? serverSentChunks(response.body) : response.json();
  }
  return { info: { model: { name: 'smollm2' } }, chat: { completions: { create } }, unload: async () => {} };
}

async function* serverSentChunks(body) {
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const bytes of body) {
    buffer += decoder.decode(bytes, { stream: true }).replaceAll('\r\n', '\n');
    for (let end; (end = buffer.indexOf('\n\n')) >= 0; buffer = buffer.slice(end + 2)) {
      for (const line of buffer.slice(0, end).split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        yield JSON.parse(data);
      }
    }
  }
}

/** The server's own greedy answer to `messages`. */
async function direct(messages, maxTokens) {
  const answer = await serverEngine(server.url).chat.completions.create({ messages, max_tokens: maxTokens, temperature: 0 });
  return { text: answer.choices[0].message.content, usage: answer.usage, finish: answer.choices[0].finish_reason };
}

before(async () => {
  // Every call generates (no response cache): each stream is the engine's, chunk by chunk.
  server = await startKestrelServe(['--backend', 'cpu', '--response-cache-mb', '0']);
});
after(() => server?.close());

const City = z.object({ name: z.string().max(20), population: z.number().int().min(0).max(50_000_000), capital: z.boolean() });

for (const { major, specification, sdk } of VERSIONS) {
  describe(`ai ${major} (LanguageModel${specification.toUpperCase()})`, () => {
    let kestrel;
    before(async () => {
      const { createKestrel } = await import(`${PROVIDER}?ai=${major}`);
      kestrel = createKestrel({ engine: serverEngine(server.url) });
      logged.length = 0;
    });
    after(() => {
      const compatibility = logged.filter((w) => w.type === 'compatibility');
      assert.deepEqual(compatibility, [], `ai ${major} called the model in a compatibility mode`);
    });

    test('the provider and its model are of the specification this ai calls', () => {
      const model = kestrel('smol');
      assert.deepEqual([model.specificationVersion, model.provider, model.modelId], [specification, 'kestrel', 'smol']);
      assert.equal(kestrel.languageModel('x').specificationVersion, specification);
      // ProviderV2 has no specificationVersion; V3 and V4 name theirs.
      assert.equal(kestrel.specificationVersion, specification === 'v2' ? undefined : specification);
      const embedding = specification === 'v2' ? 'textEmbeddingModel' : 'embeddingModel';
      assert.throws(() => kestrel[embedding]('e5'), (e) => sdk.NoSuchModelError.isInstance(e) && e.modelType === embedding);
    });

    test('generateText and streamText give the server\'s greedy text and token counts', async () => {
      const prompt = 'Write about the sea.';
      const expected = await direct([{ role: 'user', content: prompt }], 12);
      const generated = await sdk.generateText({ model: kestrel(), prompt, maxOutputTokens: 12, temperature: 0 });
      const streamed = sdk.streamText({ model: kestrel(), prompt, maxOutputTokens: 12, temperature: 0 });
      const types = new Set();
      for await (const part of streamed.fullStream) types.add(part.type);
      const out = {
        generated: { text: generated.text, finish: generated.finishReason, input: generated.usage.inputTokens, output: generated.usage.outputTokens, warnings: generated.warnings },
        streamed: { text: await streamed.text, finish: await streamed.finishReason, input: (await streamed.usage).inputTokens, output: (await streamed.usage).outputTokens, warnings: await streamed.warnings },
      };
      console.log(`ai ${major}:`, JSON.stringify({ expected: expected.text, ...out, types: [...types] }));
      assert.ok(expected.text.length > 0);
      for (const got of [out.generated, out.streamed]) {
        assert.deepEqual(got, { text: expected.text, finish: 'length', input: expected.usage.prompt_tokens, output: expected.usage.completion_tokens, warnings: [] });
      }
      for (const type of ['start', 'start-step', 'text-start', 'text-delta', 'text-end', 'finish-step', 'finish']) assert.ok(types.has(type), `${type} in ${[...types]}`);
    });

    test('generateObject and streamObject give objects valid against a zod schema', async () => {
      const prompt = 'Describe a city as JSON.';
      const { object, finishReason } = await sdk.generateObject({ model: kestrel(), schema: City, prompt, temperature: 0, maxOutputTokens: 120 });
      const stream = sdk.streamObject({ model: kestrel(), schema: City, prompt, temperature: 0, maxOutputTokens: 120 });
      let partials = 0;
      for await (const _ of stream.partialObjectStream) partials += 1;
      const streamed = await stream.object;
      console.log(`ai ${major}:`, JSON.stringify({ object, streamed, partials }));
      assert.equal(finishReason, 'stop');
      City.parse(object);
      assert.deepEqual(streamed, object, 'greedy: the streamed object is the whole one');
      assert.ok(partials > 1, 'the object streamed in parts');
    });

    test('a tool call is run by the SDK with valid arguments, whole and streamed', async () => {
      const seen = [];
      const inputSchema = z.object({ city: z.string().max(30) });
      const tools = {
        weather: sdk.tool({ description: 'The current weather in a city.', inputSchema, execute: async ({ city }) => { seen.push(city); return { city, temperature: 18 }; } }),
      };
      const settings = { tools, prompt: 'What is the weather in Paris?', temperature: 0, maxOutputTokens: 80, providerOptions: { kestrel: { parallel_tool_calls: false } } };
      const whole = await sdk.generateText({ model: kestrel(), toolChoice: 'required', ...settings });
      const streamed = sdk.streamText({ model: kestrel(), toolChoice: { type: 'tool', toolName: 'weather' }, ...settings });
      const types = new Set();
      for await (const part of streamed.fullStream) types.add(part.type);
      const calls = [...whole.toolCalls, ...(await streamed.toolCalls)];
      console.log(`ai ${major}:`, JSON.stringify({ calls, results: whole.toolResults.map((r) => r.output), types: [...types] }));
      assert.deepEqual([whole.finishReason, await streamed.finishReason], ['tool-calls', 'tool-calls']);
      assert.equal(calls.length, 2);
      for (const call of calls) {
        assert.equal(call.toolName, 'weather');
        assert.ok(!call.invalid && inputSchema.safeParse(call.input).success, JSON.stringify(call));
      }
      assert.equal(seen.length, 2, 'the SDK ran the tool once a call, with the parsed arguments');
      assert.deepEqual(whole.toolResults[0].output, { city: seen[0], temperature: 18 });
      for (const type of ['tool-input-start', 'tool-input-delta', 'tool-input-end', 'tool-call', 'tool-result']) assert.ok(types.has(type), `${type} in ${[...types]}`);
    });

    test('doGenerate writes the finish reason, usage and warnings in the specification\'s forms', async () => {
      const search = specification === 'v2'
        ? { type: 'provider-defined', id: 'other.search', name: 'search', args: {} }
        : { type: 'provider', id: 'other.search', name: 'search', args: {} };
      const result = await kestrel().doGenerate({
        maxOutputTokens: 1, temperature: 0, headers: { 'user-agent': `ai/${major}`, 'x-trace': '1' }, tools: [search],
        prompt: [{ role: 'user', content: [{ type: 'text', text: 'Hi' }, { type: 'file', data: 'YWJj', mediaType: 'text/plain' }] }],
      });
      const { usage } = result;
      const tokens = specification === 'v2' ? [usage.inputTokens, usage.outputTokens, usage.totalTokens] : [usage.inputTokens.total, usage.outputTokens.total, usage.raw.total_tokens];
      assert.equal(tokens[1], 1);
      assert.equal(tokens[2], tokens[0] + 1);
      const details = {
        file: 'Kestrel takes text, tool calls and tool results; this part was left out of the prompt',
        search: 'Kestrel runs function tools only; this tool was not given to the model',
        headers: 'Kestrel makes no HTTP request of its own: x-trace not sent',
      };
      if (specification === 'v2') {
        assert.equal(result.finishReason, 'length');
        assert.deepEqual(result.warnings, [
          { type: 'other', message: `file part in a user message is not supported: ${details.file}` },
          { type: 'unsupported-tool', tool: search, details: details.search },
          { type: 'unsupported-setting', setting: 'headers', details: details.headers },
        ]);
      } else {
        assert.deepEqual(result.finishReason, { unified: 'length', raw: 'length' });
        assert.deepEqual(result.warnings, [
          { type: 'unsupported', feature: 'file part in a user message', details: details.file },
          { type: 'unsupported', feature: 'provider tool search', details: details.search },
          { type: 'unsupported', feature: 'headers', details: details.headers },
        ]);
      }
    });
  });
}

test('an ai outside 5-7 is refused with a KestrelError naming its version and the supported ones', async () => {
  for (const version of ['4.3.19', '8.0.0']) {
    const { createKestrel } = await import(`${PROVIDER}?ai=${version}`);
    assert.throws(() => createKestrel({ engine: serverEngine(server.url) }), (e) => {
      assert.equal(e.name, 'KestrelError');
      assert.equal(e.code, 'invalid_option');
      assert.match(e.message, new RegExp(`^ai ${version.replaceAll('.', '\\.')} is installed: .*ai 5, 6 and 7 .*">=5 <8"`));
      return true;
    });
  }
});
