// The remote fall-through: in a browser without WebGPU, an engine created with `remote` sends the
// same requests to an OpenAI-compatible server (here `kestrel serve`, started by the test) and
// answers in the same shapes: streamed chunks, whole completions, abort and error codes.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { startServer } from '../../www/serve.mjs';
import { MINUTES, MODEL_URL, launch, nativeGreedy, openTestPage, startKestrelServe } from './harness.mjs';

const PROMPT = 'Tell me about kestrels.';
const MAX_TOKENS = 8;

test('without WebGPU, `remote` runs the same requests on an OpenAI-compatible server', { timeout: 10 * MINUTES }, async () => {
  const pages = await startServer();
  // The server on the CPU backend (the one it picks here by itself), compared with the CLI's.
  const api = await startKestrelServe(['--backend', 'cpu', '--cors-origin', new URL(pages.url).origin, '--api-key', 'page-key']);
  const browser = await launch({ webgpu: false });
  try {
    const page = await openTestPage(browser.context, pages.url);
    const r = await page.evaluate(async ({ model, baseURL, prompt, maxTokens }) => {
      const { createEngine } = window.kestrel;
      const engine = await createEngine({ model, remote: { baseURL, apiKey: 'page-key', model: 'smollm2' } });
      const request = { messages: [{ role: 'user', content: prompt }], max_tokens: maxTokens, temperature: 0 };
      let text = '';
      let last = null;
      for await (const chunk of await engine.chat.completions.create({ ...request, stream: true })) {
        text += chunk.choices[0]?.delta?.content ?? '';
        last = chunk;
      }
      const whole = await engine.chat.completions.create(request);
      // Tool calls pass through: the server's streamed delta.tool_calls become the package's.
      const tools = [{ type: 'function', function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } } }];
      const called = await engine.chat.completions.create({ messages: request.messages, tools, tool_choice: 'required', parallel_tool_calls: false, temperature: 0, max_tokens: 80 });
      // Aborted after the first piece of text: the stream ends with finish_reason "abort".
      const controller = new AbortController();
      let pieces = 0;
      let finish = null;
      const long = { prompt: 'Once upon a time', max_tokens: 200, ignore_eos: true, stream: true, signal: controller.signal };
      for await (const chunk of await engine.completions.create(long)) {
        if (chunk.choices[0]?.text) {
          pieces += 1;
          controller.abort();
        }
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
      const failure = await engine.completions.create({ prompt: 'x', temperature: -1 }).catch((e) => ({ code: e.code, message: e.message }));
      const wrongKey = await (await createEngine({ model, remote: { baseURL, apiKey: 'wrong' } })).completions
        .create({ prompt: 'x', max_tokens: 1 }).catch((e) => ({ code: e.code, remote: e.remote, typed: e instanceof window.kestrel.KestrelError }));
      // Checked in the page before sending: a server nobody listens on never hears of these, and
      // they fail with the local engines' codes (not remote_error, as an unreachable server would).
      const offline = await createEngine({ model, remote: { baseURL: 'http://127.0.0.1:9/v1' } });
      const local = {};
      for (const [name, bad] of Object.entries({
        temperature: { prompt: 'x', temperature: -1 },
        max_tokens: { prompt: 'x', max_tokens: 0 },
        top_p: { messages: [{ role: 'user', content: 'x' }], top_p: 2, stream: true },
        stop: { prompt: 'x', stop: [''] },
      })) {
        try {
          const result = await (bad.messages ? offline.chat.completions.create(bad) : offline.completions.create(bad));
          if (Symbol.asyncIterator in result) for await (const chunk of result) void chunk;
          local[name] = null;
        } catch (e) {
          local[name] = { code: e.code, message: e.message };
        }
      }
      const unreachable = await offline.completions.create({ prompt: 'x', max_tokens: 1 }).catch((e) => e.code);
      await offline.unload();
      return { info: engine.info, text, last, whole, called: called.choices[0], pieces, finish, failure, wrongKey, local, unreachable };
    }, { model: MODEL_URL, baseURL: api.url, prompt: PROMPT, maxTokens: MAX_TOKENS });
    console.log('remote:', JSON.stringify({ info: r.info, text: r.text, usage: r.last.usage, pieces: r.pieces, failure: r.failure }));

    assert.equal(r.info.backend, 'remote');
    assert.equal(r.info.fallback.code, 'no_webgpu');
    assert.equal(r.info.remote.baseURL, api.url);
    // The server's greedy tokens are the native CLI's, and the package's chunks carry them.
    const expected = nativeGreedy(PROMPT, MAX_TOKENS, 'cpu');
    assert.equal(r.text, expected.text);
    assert.deepEqual(r.last.kestrel.token_ids, expected.token_ids);
    assert.deepEqual(r.last.kestrel.prompt_token_ids, expected.prompt_token_ids);
    assert.equal(r.last.choices[0].finish_reason, expected.finish_reason);
    assert.equal(r.last.usage.completion_tokens, expected.token_ids.length);
    assert.equal(r.last.usage.prompt_tokens, expected.prompt_token_ids.length);
    assert.equal(r.whole.object, 'chat.completion');
    assert.equal(r.whole.choices[0].message.content, expected.text);
    assert.equal(r.called.finish_reason, 'tool_calls');
    assert.equal(r.called.message.tool_calls[0].function.name, 'add');
    assert.equal(typeof JSON.parse(r.called.message.tool_calls[0].function.arguments).a, 'number');
    assert.equal(r.finish, 'abort');
    assert.ok(r.pieces >= 1 && r.pieces < 50, `${r.pieces} pieces streamed after the abort`);
    assert.equal(r.failure.code, 'invalid_option');
    assert.match(r.failure.message, /temperature/);
    // A server's own code that means nothing to the package: remote_error, with the server's code kept.
    assert.deepEqual(r.wrongKey, { code: 'remote_error', remote: { status: 401, code: 'invalid_api_key' }, typed: true });
    for (const [name, e] of Object.entries(r.local)) {
      assert.equal(e?.code, 'invalid_option', `${name}: ${JSON.stringify(e)}`);
      assert.ok(e.message.includes(name), `${name}: ${e.message}`);
    }
    assert.equal(r.unreachable, 'remote_error', 'a valid request does go to the server');
  } finally {
    await browser.close();
    await api.close();
    await pages.close();
  }
});
