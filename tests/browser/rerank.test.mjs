// Reranking in the page (`engine.rerank`) on the random-weight bert reranker that kestrel-model's
// rerankers_match_llama_cpp writes with llama.cpp's scores of its query's documents (`./build.sh`
// copies both into models/): the scores within 1e-3 of llama.cpp's (probabilities: the sigmoid of
// the head's logit, as node-llama-cpp's rankAll), best first, `top_n` and `return_documents`, the
// bad-input codes, what `info` and `estimate` say of a reranker, llama.cpp's scores again on an
// engine with a GPU device (its layers run on the GPU), and the same answer through the shared
// engine's hub. Then a remote engine: `rerank` POSTs to a real `kestrel serve`'s /v1/rerank.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { MINUTES, ROOT, launch, openTestPage, serveAndLaunch, startKestrelServe } from './harness.mjs';
import { startServer } from '../../www/serve.mjs';

const RERANKER = '/models/synthetic-bert-pool4-f32.gguf';
const LLAMA_CPP = JSON.parse(readFileSync(join(ROOT, `${RERANKER.slice(1)}.rank.json`), 'utf8'));
const DOCUMENTS = LLAMA_CPP.cases.map((c) => c.document);

/** Checks `answer` (all documents, no `top_n`) against llama.cpp's scores. */
function assertLlamaCppScores(answer) {
  assert.equal(answer.object, 'list');
  assert.deepEqual(answer.results.map((r) => r.index).sort(), DOCUMENTS.map((_, i) => i));
  const scores = answer.results.map((r) => r.relevance_score);
  assert.deepEqual(scores, [...scores].sort((a, b) => b - a), 'best first');
  for (const r of answer.results) {
    const want = LLAMA_CPP.cases[r.index].score;
    assert.ok(Math.abs(r.relevance_score - want) < 1e-3, `${JSON.stringify(DOCUMENTS[r.index])}: ${r.relevance_score}, llama.cpp ${want}`);
    assert.equal(r.document, undefined);
  }
  const tokens = LLAMA_CPP.cases.reduce((sum, c) => sum + c.tokens.length, 0);
  assert.deepEqual(answer.usage, { prompt_tokens: tokens, total_tokens: tokens });
}

describe('Reranking in Chromium', { timeout: 5 * MINUTES }, () => {
  const env = serveAndLaunch();

  test('a reranker scores as llama.cpp does; bad input and embeddings get invalid_option', { timeout: 3 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    const r = await page.evaluate(async ({ model, query, documents }) => {
      const { createEngine, estimate } = window.kestrel;
      const codeOf = (promise) => promise.then(() => 'ok', (e) => (e.name === 'KestrelError' ? e.code : e.name));
      const engine = await createEngine({ model, backend: 'cpu' });
      const all = await engine.rerank({ query, documents });
      const top = await engine.rerank({ query, documents, top_n: 2, return_documents: true, model: 'bge' });
      const codes = {
        emptyQuery: await codeOf(engine.rerank({ query: '', documents })),
        noDocuments: await codeOf(engine.rerank({ query, documents: [] })),
        notStrings: await codeOf(engine.rerank({ query, documents: [1] })),
        tooMany: await codeOf(engine.rerank({ query, documents: Array(2049).fill('a') })),
        topN: await codeOf(engine.rerank({ query, documents, top_n: 0 })),
        unknownField: await codeOf(engine.rerank({ query, documents, rank_fields: ['text'] })),
        notAnObject: await codeOf(engine.rerank('query')),
        tooLong: await codeOf(engine.rerank({ query, documents: ['word '.repeat(200)] })),
        embed: await codeOf(engine.embeddings.create({ input: 'x' })),
      };
      const info = { kind: engine.info.kind, pooling: engine.info.model.pooling, backend: engine.info.backend };
      const fit = await estimate({ model });
      await engine.unload();
      // On an engine with a GPU device the reranker's layers run on the GPU.
      const onGpu = await createEngine({ model, backend: 'webgpu' });
      const gpuInfo = { kind: onGpu.info.kind, backend: onGpu.info.backend, reason: onGpu.info.backend_reason };
      const gpuAll = await onGpu.rerank({ query, documents });
      await onGpu.unload();
      const shared = await createEngine({ model, backend: 'cpu', shared: true });
      const viaHub = await shared.rerank({ query, documents });
      const sharedInfo = { kind: shared.info.kind, mode: shared.info.shared?.mode };
      await shared.unload();
      return { all, top, codes, info, fit: { kind: fit.kind, kv: fit.kv_cache_bytes }, gpuInfo, gpuAll, viaHub, sharedInfo };
    }, { model: RERANKER, query: LLAMA_CPP.query, documents: DOCUMENTS });

    assertLlamaCppScores(r.all);
    assert.equal(r.all.model, 'synthetic bert');
    assert.equal(r.top.model, 'bge');
    assert.deepEqual(r.top.results.map((x) => x.index), r.all.results.slice(0, 2).map((x) => x.index));
    assert.deepEqual(r.top.results.map((x) => x.document.text), r.top.results.map((x) => DOCUMENTS[x.index]));
    assert.deepEqual(r.codes, {
      emptyQuery: 'invalid_option', noDocuments: 'invalid_option', notStrings: 'invalid_option', tooMany: 'invalid_option', topN: 'invalid_option',
      unknownField: 'invalid_option', notAnObject: 'invalid_option', tooLong: 'context_overflow', embed: 'invalid_option',
    });
    assert.deepEqual(r.info, { kind: 'reranker', pooling: 'rank', backend: 'cpu' });
    assert.deepEqual(r.fit, { kind: 'reranker', kv: 0 });
    assert.deepEqual(r.gpuInfo, { kind: 'reranker', backend: 'webgpu', reason: null });
    assertLlamaCppScores(r.gpuAll);
    assert.deepEqual(r.viaHub, r.all);
    assert.equal(r.sharedInfo.kind, 'reranker');
  });
});

test('a remote engine POSTs rerank to kestrel serve\'s /v1/rerank', { timeout: 3 * MINUTES }, async () => {
  const pages = await startServer();
  const api = await startKestrelServe(['--model', join(ROOT, RERANKER.slice(1)), '--cors-origin', new URL(pages.url).origin, '--api-key', 'page-key']);
  const browser = await launch({ webgpu: false });
  try {
    const page = await openTestPage(browser.context, pages.url);
    const r = await page.evaluate(async ({ model, baseURL, query, documents }) => {
      const engine = await window.kestrel.createEngine({ model, remote: { baseURL, apiKey: 'page-key', model: 'reranker' } });
      const codeOf = (promise) => promise.then(() => 'ok', (e) => (e.name === 'KestrelError' ? e.code : e.name));
      return {
        backend: engine.info.backend,
        answer: await engine.rerank({ query, documents }),
        // Refused in the page, as a local engine refuses it: never sent.
        local: await codeOf(engine.rerank({ query: '', documents })),
        // Refused by the server: a pair past the model's context, under the local engine's code.
        server: await engine.rerank({ query, documents: ['word '.repeat(200)] }).catch((e) => ({ code: e.code, remote: e.remote })),
      };
    }, { model: RERANKER, baseURL: api.url, query: LLAMA_CPP.query, documents: DOCUMENTS });
    assert.equal(r.backend, 'remote');
    assertLlamaCppScores(r.answer);
    assert.equal(r.answer.model, 'reranker', 'the engine\'s remote model, echoed');
    assert.equal(r.local, 'invalid_option');
    assert.deepEqual(r.server, { code: 'context_overflow', remote: { status: 400, code: 'context_length_exceeded' } });
  } finally {
    await browser.close();
    await api.close();
    await pages.close();
  }
});
