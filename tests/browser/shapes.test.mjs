// Local and remote engines answer in exactly the same shapes: one table of requests runs on a
// local engine (the CPU backend here) and on a remote one (`kestrel serve` on the CPU backend), and
// every answer, streamed chunk by chunk or whole, has the same fields with the same types, and the
// same tokens, texts, finish reasons, counts and error codes. Both are written by the engine core's
// OpenAI layer (kestrel-engine), the remote one from the server's stream. And the package's types
// say what the runtime does: every request of the table and every answer it gave is written out as
// a TypeScript literal of the type index.d.ts gives it and type-checked strictly, so a field the
// runtime sends that the types lack (or the reverse) fails here.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startServer } from '../../www/serve.mjs';
import { MINUTES, MODEL_URL, launch, openTestPage, startKestrelServe } from './harness.mjs';

const chat = (extra) => ({ kind: 'chat', request: { messages: [{ role: 'user', content: 'Name a bird.' }], max_tokens: 4, temperature: 0, ...extra } });
const text = (extra) => ({ kind: 'completions', request: { prompt: 'The kestrel is', max_tokens: 4, temperature: 0, ...extra } });

/** The table: each request as a page passes it, on both engines. */
const TABLE = {
  // Every OpenAI snippet passes `model`: taken, and the engine's model answers.
  'chat, whole': chat({ model: 'gpt-4o-mini' }),
  'chat, streamed': chat({ stream: true }),
  'chat, streamed with include_usage': chat({ stream: true, stream_options: { include_usage: true } }),
  'chat, with logprobs': chat({ logprobs: true, top_logprobs: 2 }),
  'text, whole': text({}),
  'text, streamed with logprobs': text({ stream: true, logprobs: true }),
  'text, stop string': text({ max_tokens: 12, stop: [' bird'] }),
  // A remote engine knows no prompt tokens of a request it never sent: only the end is compared.
  'text, aborted before it starts': { ...text({ stream: true }), abort: true, compare: 'end' },
  'refused: top_p 2': text({ top_p: 2 }),
  'refused: messages on completions': { kind: 'completions', request: { messages: [{ role: 'user', content: 'x' }] } },
};

/**
 * A value's shape: objects by their sorted keys, arrays by each element, primitives by type. An
 * array of numbers (token ids, a token's bytes) is one shape whatever its length: the two engines
 * may rank a close alternative differently (native and wasm SIMD round apart), and its bytes with it.
 */
function shape(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return v.length > 0 && v.every((x) => typeof x === 'number') ? 'number[]' : v.map(shape);
  if (typeof v === 'object') return Object.fromEntries(Object.keys(v).sort().map((k) => [k, shape(v[k])]));
  return typeof v;
}

/** What must be equal besides the shape: no ids, times or speeds. */
function values(answer) {
  if (answer.error) return answer.error.code;
  const all = answer.chunks ?? [answer.whole];
  return all.map((c) => ({
    object: c.object,
    model: c.model,
    choices: c.choices.map(({ delta, message, text, finish_reason, token_id }) => ({ delta, message, text, finish_reason, token_id })),
    usage: c.usage && { prompt: c.usage.prompt_tokens, completion: c.usage.completion_tokens, total: c.usage.total_tokens, cached: c.usage.prompt_tokens_details.cached_tokens },
    kestrel: c.kestrel && { prompt: c.kestrel.prompt_token_ids, tokens: c.kestrel.token_ids, logprobs: c.kestrel.logprobs.map((l) => l.token_id) },
  }));
}

const HERE = dirname(fileURLToPath(import.meta.url));

/**
 * Type-checks the table's requests and the answers `answers` gave (name: {local, remote}) against
 * index.d.ts: each as a literal of its declared type, so excess and missing fields are errors.
 */
function typeCheck(answers) {
  const dir = join(HERE, '../artifacts/types');
  mkdirSync(dir, { recursive: true });
  const lines = ["import type { ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Completion, CompletionRequest } from '../../../www/index.js';"];
  let n = 0;
  for (const [name, entry] of Object.entries(TABLE)) {
    const chat = entry.kind === 'chat';
    // A request the runtime refuses need not type-check (the types cannot say `top_p <= 1`).
    if (answers[name].local.error) continue;
    lines.push(`// ${name}`, `export const request${n}: ${chat ? 'ChatCompletionRequest' : 'CompletionRequest'} = ${JSON.stringify(entry.request)};`);
    for (const [side, answer] of Object.entries(answers[name])) {
      if (answer.error) continue;
      const type = answer.chunks ? `${chat ? 'ChatCompletionChunk' : 'Completion'}[]` : chat ? 'ChatCompletion' : 'Completion';
      lines.push(`export const answer${n}_${side}: ${type} = ${JSON.stringify(answer.chunks ?? answer.whole)};`);
    }
    n++;
  }
  writeFileSync(join(dir, 'shapes.generated.ts'), lines.join('\n') + '\n');
  const config = { compilerOptions: { strict: true, noEmit: true, target: 'es2022', module: 'esnext', moduleResolution: 'bundler', lib: ['es2022', 'dom'], types: [] }, files: ['shapes.generated.ts'] };
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify(config, null, 1));
  try {
    execFileSync(join(HERE, 'node_modules/.bin/tsc'), ['-p', dir], { encoding: 'utf8' });
  } catch (e) {
    assert.fail(`the runtime's requests and answers do not type-check against index.d.ts (${join(dir, 'shapes.generated.ts')}):\n${e.stdout}${e.stderr}`);
  }
}

test('local and remote engines answer one table of requests in the same shapes', { timeout: 10 * MINUTES }, async () => {
  const pages = await startServer();
  // Without the server's response cache, which answers a repeated greedy request as one chunk.
  const api = await startKestrelServe(['--backend', 'cpu', '--response-cache-mb', '0', '--cors-origin', new URL(pages.url).origin]);
  const browser = await launch({ webgpu: false });
  try {
    const page = await openTestPage(browser.context, pages.url);
    const r = await page.evaluate(async ({ model, baseURL, table }) => {
      const { createEngine } = window.kestrel;
      const local = await createEngine({ model, backend: 'cpu' });
      // No WebGPU here: backend 'webgpu' falls through to the server, under the local model's name.
      const remote = await createEngine({ model, backend: 'webgpu', remote: { baseURL, model: local.info.model.name } });
      const run = async (engine, { kind, request, abort }) => {
        const controller = new AbortController();
        if (abort) controller.abort();
        const create = kind === 'chat' ? engine.chat.completions.create : engine.completions.create;
        try {
          const out = await create({ ...request, signal: controller.signal });
          if (!(Symbol.asyncIterator in out)) return { whole: out };
          const chunks = [];
          for await (const c of out) chunks.push(c);
          return { chunks };
        } catch (e) {
          return { error: { code: e.code, message: e.message } };
        }
      };
      const answers = {};
      for (const [name, entry] of Object.entries(table)) answers[name] = { local: await run(local, entry), remote: await run(remote, entry) };
      const backends = [local.info.backend, remote.info.backend];
      await local.unload();
      await remote.unload();
      return { answers, backends };
    }, { model: MODEL_URL, baseURL: api.url, table: TABLE });
    assert.deepEqual(r.backends, ['cpu', 'remote']);
    for (const [name, { local, remote }] of Object.entries(r.answers)) {
      if (TABLE[name].compare === 'end') {
        const end = (a) => [a.chunks.length, a.chunks.at(-1).choices[0].finish_reason, a.chunks.at(-1).usage.completion_tokens];
        assert.deepEqual(end(remote), end(local), `${name}: the ends differ`);
        continue;
      }
      assert.deepEqual(shape(remote), shape(local), `${name}: the shapes differ`);
      assert.deepEqual(values(remote), values(local), `${name}: the answers differ`);
    }
    // The table means something: answers that stream, that end early, and that fail.
    const a = r.answers;
    assert.ok(a['chat, streamed'].local.chunks.length >= 3, 'a role chunk, tokens and the final chunk');
    assert.equal(a['chat, streamed with include_usage'].local.chunks.at(-1).choices.length, 0);
    assert.equal(a['text, aborted before it starts'].local.chunks.at(-1).choices[0].finish_reason, 'abort');
    assert.equal(a['text, stop string'].local.whole.choices[0].finish_reason, 'stop');
    assert.equal(a['chat, with logprobs'].local.whole.kestrel.logprobs[0].top.length, 2);
    assert.equal(a['refused: top_p 2'].local.error.code, 'invalid_option');
    assert.equal(a['refused: messages on completions'].remote.error.code, 'invalid_option');
    typeCheck(r.answers);
  } finally {
    await browser.close();
    await api.close();
    await pages.close();
  }
});
