// The Vercel AI SDK against `kestrel serve`, as an app would use it: `ai` with
// `@ai-sdk/openai-compatible` (structured outputs on), `generateObject` and `streamObject` with a
// zod schema, and `generateText` with a tool. The server's model is the default one on the CPU
// backend; the SDK validates every object against the schema itself.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateObject, generateText, streamObject, tool } from 'ai';
import { z } from 'zod';
import { startKestrelServe } from '../browser/harness.mjs';

const City = z.object({ name: z.string().max(20), population: z.number().int().min(0).max(50_000_000), capital: z.boolean() });

let server;
let model;

before(async () => {
  server = await startKestrelServe(['--backend', 'cpu']);
  const kestrel = createOpenAICompatible({ name: 'kestrel', baseURL: server.url, supportsStructuredOutputs: true });
  model = kestrel.chatModel('smollm2');
});

after(() => server?.close());

test('generateObject and streamObject return objects valid against a zod schema', async () => {
  const prompt = 'Describe a city as JSON.';
  const { object, finishReason } = await generateObject({ model, schema: City, prompt, temperature: 0, maxOutputTokens: 120 });
  console.log('generateObject:', JSON.stringify(object));
  assert.equal(finishReason, 'stop');
  City.parse(object);
  const stream = streamObject({ model, schema: City, prompt, temperature: 1, seed: 7, maxOutputTokens: 120 });
  let partials = 0;
  for await (const _ of stream.partialObjectStream) partials += 1;
  const streamed = await stream.object;
  console.log('streamObject:', JSON.stringify(streamed), `${partials} partial objects`);
  City.parse(streamed);
  assert.ok(partials > 1, 'the object streamed in parts');
});

test('generateText calls a tool with valid arguments, which the SDK runs', async () => {
  const seen = [];
  const weather = tool({
    description: 'The current weather in a city.',
    inputSchema: z.object({ city: z.string().max(30) }),
    execute: async ({ city }) => {
      seen.push(city);
      return { city, temperature: 18 };
    },
  });
  const first = await generateText({
    model, tools: { weather }, toolChoice: 'required', prompt: 'What is the weather in Paris?', temperature: 0, maxOutputTokens: 80,
    // Kestrel's body fields pass through the provider's options: one call (a 135M model repeats it).
    providerOptions: { kestrel: { parallel_tool_calls: false } },
  });
  console.log('tool calls:', JSON.stringify(first.toolCalls), 'results:', JSON.stringify(first.toolResults));
  assert.equal(first.finishReason, 'tool-calls');
  assert.equal(first.toolCalls[0].toolName, 'weather');
  assert.equal(seen.length, 1, 'the SDK ran the tool with the parsed arguments');
  assert.equal(typeof seen[0], 'string');
});
