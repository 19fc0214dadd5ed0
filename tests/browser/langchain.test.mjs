// LangChain.js's chat model over Kestrel (www/langchain.js) in the page, on the CPU backend: its
// greedy text, whole and streamed, is the engine's own on the same request; AI tool calls and
// tool results reach the engine as the equivalent OpenAI messages; bound tools give valid calls
// (a forced OpenAI tool's the engine's own); structured output from a zod schema parses (by
// json_schema, the engine's own answer, and by a forced call), a JSON Schema shapes it; an
// aborted call rejects; bad input is a KestrelError. The page loads a bundle (esbuild) of
// langchain.js with @langchain/core and zod, which keeps /www/*.js external so that index.js
// starts its worker from the server.
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import Ajv from 'ajv';
import * as esbuild from 'esbuild';
import { ARTIFACTS, CONTEXT_LENGTH, MINUTES, MODEL_URL, ROOT, openTestPage, serveAndLaunch } from './harness.mjs';

const BUNDLE = join(ARTIFACTS, 'langchain/page-bundle.js');
const WWW = join(ROOT, 'www');

/** Bundles what the page imports; files of www/ but langchain.js stay external, served as /www/*. */
async function bundle() {
  mkdirSync(join(ARTIFACTS, 'langchain'), { recursive: true });
  const entry = join(WWW, 'langchain.js');
  await esbuild.build({
    stdin: {
      contents: `export { ChatKestrel } from '../../www/langchain.js';
        export { AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage } from '@langchain/core/messages';
        export { tool } from '@langchain/core/tools';
        export { z } from 'zod';`,
      resolveDir: join(ROOT, 'tests/browser'),
      loader: 'js',
    },
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: 'es2022',
    outfile: BUNDLE,
    // langchain.js lives outside tests/browser, whose node_modules has @langchain/core.
    nodePaths: [join(ROOT, 'tests/browser/node_modules')],
    logLevel: 'error',
    plugins: [{
      name: 'www-external',
      setup(build) {
        build.onResolve({ filter: /^\.\.?\// }, (args) => {
          const path = resolve(args.resolveDir, args.path);
          if (path.startsWith(WWW + '/') && path !== entry) return { path: `/www/${relative(WWW, path)}`, external: true };
          return undefined;
        });
      },
    }],
  });
  return `/${relative(ROOT, BUNDLE)}`;
}

const PLACE = { type: 'object', properties: { city: { type: 'string', maxLength: 20 } }, required: ['city'], additionalProperties: false };

const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 30 } }, required: ['city'], additionalProperties: false },
  },
};

describe('LangChain chat model (ChatKestrel) in Chromium, CPU backend', { timeout: 20 * MINUTES }, () => {
  let page;
  // Registered before serveAndLaunch's, so it runs before the browser closes.
  after(async () => {
    await page?.evaluate(async () => (await window.chat.getEngine()).unload());
    await page?.close();
  });
  const env = serveAndLaunch();

  before(async () => {
    const url = await bundle();
    page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(10 * MINUTES);
    // One engine for the suite, created by the first ChatKestrel from createEngine's options.
    await page.evaluate(async ({ url, model, contextLength }) => {
      window.lc = await import(url);
      window.chat = new window.lc.ChatKestrel({ model, backend: 'cpu', context_length: contextLength, temperature: 0, maxTokens: 12 });
    }, { url, model: MODEL_URL, contextLength: CONTEXT_LENGTH });
  });

  test('invoke and stream give the engine\'s greedy text, with its usage and finish reason', async () => {
    const out = await page.evaluate(async () => {
      const { HumanMessage, SystemMessage } = window.lc;
      const engine = await window.chat.getEngine();
      const messages = [new SystemMessage('You are a helpful assistant.'), new HumanMessage('Name three colors.')];
      const direct = await engine.chat.completions.create({
        messages: [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'Name three colors.' }],
        temperature: 0, max_tokens: 12,
      });
      const invoked = await window.chat.invoke(messages);
      const tokens = [];
      const chunks = [];
      for await (const chunk of await window.chat.stream(messages, { callbacks: [{ handleLLMNewToken: (t) => tokens.push(t) }] })) chunks.push(chunk);
      const streamed = chunks.reduce((a, b) => a.concat(b));
      const short = await window.chat.invoke(messages, { maxTokens: 4 });
      // Sampling and stop options reach the engine under its names: the same seeded draw, the same cut.
      const sampled = await window.chat.invoke(messages, { temperature: 1, topK: 20, topP: 0.9, seed: 7, maxTokens: 8 });
      const directSampled = await engine.chat.completions.create({
        messages: [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: 'Name three colors.' }],
        temperature: 1, top_k: 20, top_p: 0.9, seed: 7, max_tokens: 8,
      });
      const stopWord = direct.choices[0].message.content.split(' ')[2];
      const stopped = await window.chat.invoke(messages, { stop: [stopWord] });
      const pick = (m) => ({ content: m.content, usage: m.usage_metadata, finish: m.response_metadata.finish_reason, type: m.type });
      return {
        direct: { content: direct.choices[0].message.content, usage: direct.usage, finish: direct.choices[0].finish_reason },
        invoked: pick(invoked), streamed: pick(streamed), short: pick(short),
        chunks: chunks.map((c) => c.content), tokens,
        sampled: sampled.content, directSampled: directSampled.choices[0].message.content, stopWord, stopped: pick(stopped),
      };
    });
    console.log(JSON.stringify({ direct: out.direct.content, chunks: out.chunks }));
    const { direct, invoked, streamed, short } = out;
    assert.ok(direct.content.length > 0);
    assert.equal(invoked.content, direct.content);
    assert.equal(invoked.type, 'ai');
    assert.equal(invoked.finish, direct.finish);
    const { input_token_details: details, ...counts } = invoked.usage;
    assert.deepEqual(counts, { input_tokens: direct.usage.prompt_tokens, output_tokens: direct.usage.completion_tokens, total_tokens: direct.usage.total_tokens });
    // The engine's KV cache held the prompt the direct request just ran.
    assert.ok(details.cache_read > 0 && details.cache_read <= counts.input_tokens, JSON.stringify(details));
    assert.equal(direct.usage.completion_tokens, 12, 'the model\'s maxTokens reached the engine');
    // Streamed: several chunks, which (and whose callback tokens) concatenate to the same text.
    assert.ok(out.chunks.filter(Boolean).length > 2, `streamed in pieces: ${JSON.stringify(out.chunks)}`);
    assert.equal(out.chunks.join(''), direct.content);
    assert.equal(out.tokens.join(''), direct.content);
    assert.equal(streamed.content, direct.content);
    assert.equal(streamed.finish, direct.finish);
    assert.equal(streamed.usage.input_tokens, direct.usage.prompt_tokens);
    assert.equal(streamed.usage.output_tokens, direct.usage.completion_tokens);
    // A call's option overrides the model's.
    assert.equal(short.usage.output_tokens, 4);
    assert.equal(short.finish, 'length');
    assert.ok(direct.content.startsWith(short.content), `${JSON.stringify(short.content)} begins ${JSON.stringify(direct.content)}`);
    assert.equal(out.sampled, out.directSampled);
    assert.notEqual(out.sampled, direct.content.slice(0, out.sampled.length), 'the sampled answer is not the greedy one');
    assert.equal(out.stopped.content, direct.content.slice(0, direct.content.indexOf(out.stopWord)));
    assert.equal(out.stopped.finish, 'stop');
  });

  test('an AI message\'s tool calls and a tool message reach the engine as OpenAI\'s messages', async () => {
    const out = await page.evaluate(async (tool) => {
      const { AIMessage, HumanMessage, ToolMessage } = window.lc;
      const engine = await window.chat.getEngine();
      const history = [
        new HumanMessage('What is the weather in Paris?'),
        new AIMessage({ content: '', tool_calls: [{ id: 'call_1', name: 'get_weather', args: { city: 'Paris' } }] }),
        new ToolMessage({ tool_call_id: 'call_1', content: '{"temperature": 18}' }),
      ];
      // With the tools in play (tool_choice auto), Kestrel writes the calls and results into the prompt.
      const answer = await window.chat.bindTools([tool]).invoke(history, { maxTokens: 8 });
      const direct = await engine.chat.completions.create({
        messages: [
          { role: 'user', content: 'What is the weather in Paris?' },
          { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
          { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 18}' },
        ],
        tools: [tool], temperature: 0, max_tokens: 8,
      });
      return {
        answer: { content: answer.content, calls: answer.tool_calls.map((c) => ({ name: c.name, args: c.args })), usage: answer.usage_metadata },
        direct: { content: direct.choices[0].message.content ?? '', calls: (direct.choices[0].message.tool_calls ?? []).map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) })), usage: direct.usage },
      };
    }, WEATHER_TOOL);
    console.log(JSON.stringify(out));
    assert.ok(out.direct.content.length > 0 || out.direct.calls.length > 0);
    assert.equal(out.answer.content, out.direct.content);
    assert.deepEqual(out.answer.calls, out.direct.calls);
    assert.equal(out.answer.usage.input_tokens, out.direct.usage.prompt_tokens, 'the same prompt');
  });

  test('bindTools: a forced zod tool\'s call validates and runs the tool; an OpenAI tool\'s streamed call is the engine\'s', async () => {
    const out = await page.evaluate(async (openaiTool) => {
      const { HumanMessage, tool, z } = window.lc;
      const engine = await window.chat.getEngine();
      const question = 'What is the weather in Paris?';
      const weather = tool(async ({ city }) => `sunny in ${city}`, {
        name: 'get_weather', description: 'The current weather in a city.', schema: z.object({ city: z.string().max(30) }),
      });
      const forced = await window.chat.bindTools([weather], { tool_choice: 'get_weather' }).invoke([new HumanMessage(question)], { maxTokens: 120 });
      const call = forced.tool_calls[0];
      const toolMessage = call ? await weather.invoke(call) : null;

      const chunks = [];
      const bound = window.chat.bindTools([openaiTool], { tool_choice: 'any', parallel_tool_calls: false });
      for await (const chunk of await bound.stream([new HumanMessage(question)], { maxTokens: 120 })) chunks.push(chunk);
      const streamed = chunks.reduce((a, b) => a.concat(b));
      const direct = await engine.chat.completions.create({
        messages: [{ role: 'user', content: question }], tools: [openaiTool], tool_choice: 'required', parallel_tool_calls: false, temperature: 0, max_tokens: 120,
      });
      return {
        forced: { content: forced.content, calls: forced.tool_calls, invalid: forced.invalid_tool_calls, finish: forced.response_metadata.finish_reason },
        valid: call ? weather.schema.safeParse(call.args).success : false,
        toolMessage: toolMessage && { type: toolMessage.type, content: toolMessage.content, tool_call_id: toolMessage.tool_call_id },
        chunkCalls: chunks.map((c) => c.tool_call_chunks ?? []).flat(),
        streamed: { content: streamed.content, calls: streamed.tool_calls, finish: streamed.response_metadata.finish_reason },
        direct: { message: direct.choices[0].message, finish: direct.choices[0].finish_reason },
      };
    }, WEATHER_TOOL);
    console.log(JSON.stringify({ forced: out.forced.calls, streamed: out.streamed.calls }));
    assert.equal(out.forced.finish, 'tool_calls');
    assert.equal(out.forced.content, '');
    assert.deepEqual(out.forced.invalid, []);
    assert.equal(out.forced.calls.length, 1);
    assert.equal(out.forced.calls[0].name, 'get_weather');
    assert.ok(out.valid, `the zod schema parses ${JSON.stringify(out.forced.calls[0].args)}`);
    assert.deepEqual(out.toolMessage, { type: 'tool', content: `sunny in ${out.forced.calls[0].args.city}`, tool_call_id: out.forced.calls[0].id });
    // Streamed: the call arrives as tool_call_chunks and concatenates to the engine's own call.
    assert.equal(out.chunkCalls.length, 1);
    assert.equal(out.chunkCalls[0].name, 'get_weather');
    assert.equal(out.streamed.finish, 'tool_calls');
    assert.equal(out.streamed.content, '');
    assert.equal(out.direct.finish, 'tool_calls');
    const [directCall] = out.direct.message.tool_calls;
    assert.deepEqual(out.streamed.calls.map((c) => ({ name: c.name, args: c.args })), [{ name: directCall.function.name, args: JSON.parse(directCall.function.arguments) }]);
  });

  test('withStructuredOutput: zod by json_schema (the engine\'s answer) and by a forced call parses; a JSON Schema shapes; jsonMode is json_object', async () => {
    const out = await page.evaluate(async (PLACE) => {
      const { ChatKestrel, z } = window.lc;
      const engine = await window.chat.getEngine();
      const Person = z.object({ name: z.string().max(20), age: z.number().int().min(0).max(120) });
      const chat = new ChatKestrel({ engine, temperature: 0, maxTokens: 60 });
      const prompt = 'Describe a person as JSON.';
      const { raw, parsed } = await chat.withStructuredOutput(Person, { name: 'person', includeRaw: true }).invoke(prompt);
      const direct = await engine.chat.completions.create({
        messages: [{ role: 'user', content: prompt }],
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema: z.toJSONSchema(Person) } },
        temperature: 0, max_tokens: 60,
      });
      const called = await chat.withStructuredOutput(Person, { method: 'functionCalling' }).invoke(prompt);
      const plain = await chat.withStructuredOutput(PLACE, { name: 'place' }).invoke(prompt);
      const mode = await chat.withStructuredOutput(Person, { method: 'jsonMode', includeRaw: true }).invoke(prompt);
      const directMode = await engine.chat.completions.create({ messages: [{ role: 'user', content: prompt }], response_format: { type: 'json_object' }, temperature: 0, max_tokens: 60 });
      return {
        raw: raw.content, parsed, parses: Person.safeParse(parsed).success,
        direct: direct.choices[0].message.content,
        called, calledParses: Person.safeParse(called).success,
        plain, mode: { raw: mode.raw.content, parsed: mode.parsed, finish: mode.raw.response_metadata.finish_reason }, directMode: directMode.choices[0].message.content,
      };
    }, PLACE);
    console.log(JSON.stringify({ parsed: out.parsed, called: out.called, plain: out.plain, mode: out.mode, directMode: out.directMode }));
    assert.equal(out.raw, out.direct, 'the same constrained answer as the engine\'s response_format');
    assert.deepEqual(out.parsed, JSON.parse(out.raw));
    assert.ok(out.parses);
    assert.equal(typeof out.called, 'object');
    assert.ok(out.calledParses, JSON.stringify(out.called));
    // A plain JSON Schema shapes the answer (nothing validates it but the constraint).
    const validate = new Ajv({ strict: false }).compile(PLACE);
    assert.ok(validate(out.plain), `${JSON.stringify(out.plain)}: ${JSON.stringify(validate.errors)}`);
    // jsonMode sends json_object: the engine's JSON answer; this model's runs past 60 tokens, so
    // it does not parse, and includeRaw gives parsed null.
    assert.equal(out.mode.raw, out.directMode);
    assert.ok(out.mode.raw.startsWith('{'));
    assert.equal(out.mode.finish, 'length');
    assert.equal(out.mode.parsed, null);
  });

  test('an aborted call rejects, whole or streamed, and the engine goes on', async () => {
    const out = await page.evaluate(async () => {
      const { ChatKestrel, HumanMessage } = window.lc;
      const engine = await window.chat.getEngine();
      const messages = [new HumanMessage('Tell me a long story.')];
      // Aborted once the request is with the engine: the engine ends it ("abort") and the call rejects.
      const controller = new AbortController();
      const finishes = [];
      const aborting = {
        chat: {
          completions: {
            async create(request) {
              const result = engine.chat.completions.create(request);
              controller.abort();
              const completion = await result;
              finishes.push(completion.choices[0].finish_reason);
              return completion;
            },
          },
        },
      };
      const whole = await new ChatKestrel({ engine: aborting, temperature: 0, maxTokens: 200 }).invoke(messages, { signal: controller.signal }).then(
        () => null, (e) => ({ name: e.name, message: e.message }));
      const streamController = new AbortController();
      let seen = 0;
      let streamed = null;
      try {
        for await (const _ of await window.chat.stream(messages, { signal: streamController.signal, maxTokens: 200 })) {
          seen++;
          if (seen === 2) streamController.abort();
        }
      } catch (e) {
        streamed = { name: e.name, message: e.message };
      }
      const direct = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Tell me a long story.' }], temperature: 0, max_tokens: 4 });
      const afterwards = await window.chat.invoke(messages, { maxTokens: 4 });
      return { whole, finishes, streamed, seen, afterwards: afterwards.content, direct: direct.choices[0].message.content };
    });
    console.log(JSON.stringify(out));
    assert.equal(out.whole?.name, 'ModelAbortError');
    assert.deepEqual(out.finishes, ['abort'], 'the engine stopped the generation');
    assert.ok(out.streamed, 'the aborted stream rejects');
    assert.equal(out.seen, 2, 'no chunk after the abort');
    assert.equal(out.afterwards, out.direct);
  });

  test('bad input is a KestrelError with code invalid_option; a failed load rejects and is retried', async () => {
    const out = await page.evaluate(async () => {
      const { ChatKestrel, ChatMessage, HumanMessage, z } = window.lc;
      const engine = await window.chat.getEngine();
      const attempt = async (f) => {
        try {
          await f();
          return null;
        } catch (e) {
          return { name: e.name, code: e.code, message: e.message };
        }
      };
      const errors = [
        await attempt(() => new ChatKestrel({ temperature: 0 })),
        await attempt(() => new ChatKestrel({ engine, model: '/elsewhere.gguf' })),
        await attempt(() => window.chat.invoke([new HumanMessage({ content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] })])),
        await attempt(() => window.chat.invoke([new ChatMessage('Once upon a time', 'narrator')])),
        await attempt(() => window.chat.bindTools([{ name_only: 'x' }])),
        await attempt(() => window.chat.bindTools([], { tool_choice: 42 })),
        await attempt(() => window.chat.withStructuredOutput(z.object({ a: z.string() }), { method: 'xml' })),
      ];
      // A model that fails to load rejects the call with the load's error, and the next call loads again.
      const missing = new ChatKestrel({ model: '/models/missing.gguf', backend: 'cpu' });
      const first = missing.getEngine();
      const load = await attempt(() => missing.invoke('Hi'));
      const retried = missing.getEngine() !== first;
      await missing.getEngine().catch(() => {});
      return { errors, load, retried };
    });
    console.log(out.errors.map((e) => e?.message).join('\n'));
    assert.equal(out.load?.name, 'KestrelError', JSON.stringify(out.load));
    assert.match(out.load.message, /missing\.gguf/);
    assert.ok(out.retried, 'a failed load is not kept');
    for (const error of out.errors) {
      assert.equal(error?.name, 'KestrelError', JSON.stringify(error));
      assert.equal(error.code, 'invalid_option');
    }
  });
});
