// Embeddings in the page (`engine.embeddings.create`) on the real all-MiniLM-L6-v2 (bert, mean
// pooling): every reference text's vector against llama.cpp's (tests/data/embeddings/minilm.json,
// cosine >= 0.999), unit length, base64 and Matryoshka `dimensions`, usage, retrieval (each query's
// own passage ranks first), the bad-input codes, an encoder refusing chat and a chat model refusing
// to embed, an encoder on a WebGPU engine (its layers on the GPU: llama.cpp's vectors again, and a
// lost device recovered from) and through the shared engine's hub; and random-weight models of
// every architecture and pooling (bert, nomic-bert, a last-token qwen3 decoder) on both backends
// against llama.cpp's vectors of the same texts. Then a remote engine:
// `embeddings.create` POSTs the same request to the server's /v1/embeddings (a recording server
// here, since the point is what goes over the wire).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, ROOT, launch, openTestPage, serveAndLaunch } from './harness.mjs';
import { startServer } from '../../www/serve.mjs';

const EMBEDDING_MODEL = '/models/all-MiniLM-L6-v2.f32.gguf';
const TEXTS = JSON.parse(readFileSync(join(ROOT, 'tests/data/embeddings/texts.json'), 'utf8'));
const LLAMA_CPP = JSON.parse(readFileSync(join(ROOT, 'tests/data/embeddings/minilm.json'), 'utf8'));

const dot = (a, b) => a.reduce((sum, x, i) => sum + x * b[i], 0);
const norm = (a) => Math.sqrt(dot(a, a));
const cosine = (a, b) => dot(a, b) / (norm(a) * norm(b));

describe('Embeddings in Chromium', { timeout: 20 * MINUTES }, () => {
  const env = serveAndLaunch();

  test('an embedding model embeds as llama.cpp does; bad input and the wrong kind of model get their codes', { timeout: 15 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(15 * MINUTES);
    const r = await page.evaluate(async ({ model, chatModel, contextLength, texts }) => {
      const { createEngine } = window.kestrel;
      // A KestrelError's code; another error's name (an abort's is 'AbortError').
      const codeOf = (promise) => promise.then(() => 'ok', (e) => (e.name === 'KestrelError' ? e.code : e.name));
      const ms = {};
      let t = performance.now();
      const lap = (name) => {
        ms[name] = Math.round(performance.now() - t);
        t = performance.now();
      };
      const engine = await createEngine({ model, backend: 'cpu' });
      lap('load');
      const all = await engine.embeddings.create({ input: texts.reference });
      lap('reference');
      const base64 = await engine.embeddings.create({ input: texts.reference, encoding_format: 'base64' });
      const short = await engine.embeddings.create({ input: texts.reference[1], dimensions: 64 });
      const queries = texts.retrieval.map((p) => p.query);
      const retrieval = await engine.embeddings.create({ input: [...queries, ...texts.retrieval.map((p) => p.passage)] });
      lap('others');
      const long = Array.from({ length: 600 }, (_, i) => `word${i % 10}`).join(' ');
      const aborted = new AbortController();
      aborted.abort();
      const codes = {
        empty: await codeOf(engine.embeddings.create({ input: '' })),
        emptyArray: await codeOf(engine.embeddings.create({ input: [] })),
        tooLong: await codeOf(engine.embeddings.create({ input: long })),
        tooManyDimensions: await codeOf(engine.embeddings.create({ input: 'x', dimensions: 385 })),
        unknownField: await codeOf(engine.embeddings.create({ input: 'x', temperature: 0 })),
        chat: await codeOf(engine.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 })),
        abortedSignal: await codeOf(engine.embeddings.create({ input: 'x', signal: aborted.signal })),
      };
      const chatMessage = await engine.completions.create({ prompt: 'hi', max_tokens: 1 }).catch((e) => e.message);
      const truncated = await engine.embeddings.create({ input: long, truncate: true });
      // Aborted while the worker runs it: rejects at once; the pass ends unread, the next call works.
      const midway = new AbortController();
      const running = engine.embeddings.create({ input: long, truncate: true, signal: midway.signal });
      await new Promise((resolve) => setTimeout(resolve, 100));
      const abortAt = performance.now();
      midway.abort();
      const abortedRunning = await codeOf(running);
      const abortMs = performance.now() - abortAt;
      const after = (await engine.embeddings.create({ input: texts.reference[0] })).data[0].embedding;
      lap('errors');
      const fit = await window.kestrel.estimate({ model });
      const info = engine.info;
      await engine.unload();

      // On an engine with a GPU device the encoder's layers run on the GPU. A lost device fails the
      // call in flight with device_lost; the engine reloads by itself and the next call is answered.
      // 'auto' picks the CPU by itself here (SwiftShader is a software adapter), through the
      // shared engine's hub.
      const statuses = [];
      const onGpu = await createEngine({ model, backend: 'webgpu', onStatus: (s) => statuses.push(s.status) });
      const gpuAll = await onGpu.embeddings.create({ input: texts.reference });
      const gpuInfo = { kind: onGpu.info.kind, backend: onGpu.info.backend, reason: onGpu.info.backend_reason, gpu: onGpu.info.gpu !== null };
      onGpu._destroyDevice();
      const lost = await codeOf(onGpu.embeddings.create({ input: texts.reference }));
      const recovered = (await onGpu.embeddings.create({ input: texts.reference[0] })).data[0].embedding;
      await onGpu.unload();
      lap('webgpu');
      const shared = await createEngine({ model, backend: 'auto', shared: true });
      const sharedHello = (await shared.embeddings.create({ input: texts.reference[0] })).data[0].embedding;
      const sharedInfo = { kind: shared.info.kind, backend: shared.info.backend, mode: shared.info.shared?.mode };
      await shared.unload();
      lap('other engines');

      const chat = await createEngine({ model: chatModel, backend: 'cpu', context_length: contextLength });
      const refused = await chat.embeddings.create({ input: 'hi' }).then(() => null, (e) => ({ code: e.code, message: e.message }));
      const chatKind = chat.info.kind;
      await chat.unload();
      return {
        all, base64, short, retrieval, codes, chatMessage, truncated: truncated.usage, abortedRunning, abortMs, after, fit, info,
        gpuAll, gpuInfo, lost, recovered, statuses, sharedHello, sharedInfo, refused, chatKind, ms,
      };
    }, { model: EMBEDDING_MODEL, chatModel: MODEL_URL, contextLength: CONTEXT_LENGTH, texts: TEXTS });
    console.log(`times (ms): ${JSON.stringify(r.ms)}; an abort mid-pass rejected in ${r.abortMs.toFixed(1)} ms`);

    assert.equal(r.info.kind, 'embedding');
    assert.equal(r.info.backend, 'cpu');
    assert.deepEqual(
      { arch: r.info.model.arch, dimensions: r.info.model.dimensions, context_length: r.info.model.context_length, pooling: r.info.model.pooling },
      { arch: 'bert', dimensions: 384, context_length: 512, pooling: 'mean' },
    );
    assert.ok(r.info.model.weight_bytes > 80e6, `weight_bytes ${r.info.model.weight_bytes}`);

    // OpenAI's shape, every vector unit length and within 0.999 of llama.cpp's (cosine).
    assert.equal(r.all.object, 'list');
    assert.equal(r.all.model, r.info.model.name);
    assert.equal(r.all.data.length, LLAMA_CPP.cases.length);
    const worst = { cosine: 1, text: null };
    for (const [i, expected] of LLAMA_CPP.cases.entries()) {
      const got = r.all.data[i];
      assert.deepEqual([got.object, got.index, got.embedding.length], ['embedding', i, 384]);
      assert.ok(Math.abs(norm(got.embedding) - 1) < 1e-4, `${expected.text}: norm ${norm(got.embedding)}`);
      const c = cosine(got.embedding, expected.vector);
      if (c < worst.cosine) Object.assign(worst, { cosine: c, text: expected.text });
      assert.ok(c >= 0.999, `${JSON.stringify(expected.text)}: cosine ${c} with llama.cpp's vector`);
    }
    console.log(`worst cosine with llama.cpp: ${worst.cosine.toFixed(6)} (${JSON.stringify(worst.text)})`);
    const tokens = LLAMA_CPP.cases.reduce((sum, c) => sum + c.tokens.length, 0);
    assert.deepEqual(r.all.usage, { prompt_tokens: tokens, total_tokens: tokens });

    // base64: the same floats, bit for bit (the JSON numbers are f32 values printed exactly).
    for (const [i, d] of r.base64.data.entries()) {
      assert.equal(typeof d.embedding, 'string');
      const floats = Array.from(new Float32Array(Uint8Array.from(Buffer.from(d.embedding, 'base64')).buffer));
      assert.deepEqual(floats, r.all.data[i].embedding.map(Math.fround), `input ${i}`);
    }

    // Matryoshka: the first 64 values, normalized again.
    const first64 = r.all.data[1].embedding.slice(0, 64);
    assert.equal(r.short.data[0].embedding.length, 64);
    assert.ok(Math.abs(norm(r.short.data[0].embedding) - 1) < 1e-4);
    assert.ok(cosine(r.short.data[0].embedding, first64) > 0.99999);

    // Retrieval: each query's own passage is the nearest of all the passages.
    const n = TEXTS.retrieval.length;
    const vectors = r.retrieval.data.map((d) => d.embedding);
    for (let q = 0; q < n; q++) {
      const scores = vectors.slice(n).map((p) => cosine(vectors[q], p));
      const best = scores.indexOf(Math.max(...scores));
      assert.equal(best, q, `${JSON.stringify(TEXTS.retrieval[q].query)} ranked passage ${best} first: ${scores.map((s) => s.toFixed(3))}`);
    }

    assert.deepEqual(r.codes, {
      empty: 'invalid_option', emptyArray: 'invalid_option', tooLong: 'context_overflow', tooManyDimensions: 'invalid_option',
      unknownField: 'invalid_option', chat: 'invalid_option', abortedSignal: 'AbortError',
    });
    assert.match(r.chatMessage, /embedding model/);
    assert.deepEqual(r.truncated, { prompt_tokens: 512, total_tokens: 512 });
    assert.equal(r.abortedRunning, 'AbortError');
    assert.ok(r.abortMs < 50, `the abort took ${r.abortMs} ms to reject`);
    assert.ok(cosine(r.after, r.all.data[0].embedding) > 0.99999);

    // estimate(): both backends' verdicts; the CPU's weights against what the CPU load stored
    // (exact equality is the native test's), and the GPU's against the adapter's limits.
    assert.deepEqual([r.fit.kind, r.fit.arch, r.fit.kv_cache_bytes, r.fit.cpu_only, r.fit.cpu.fits], ['embedding', 'bert', 0, null, true]);
    assert.ok(Math.abs(r.fit.cpu.weight_bytes / r.info.model.weight_bytes - 1) < 0.01, `${r.fit.cpu.weight_bytes} vs ${r.info.model.weight_bytes}`);
    assert.equal(r.fit.fits, true, JSON.stringify(r.fit));
    assert.ok(r.fit.weight_bytes < r.fit.cpu.weight_bytes && r.fit.activation_bytes > 0, JSON.stringify(r.fit));

    // On WebGPU: llama.cpp's vectors within the same bound, and within 0.9999 of the CPU
    // backend's (the native GPU test's bound, derived in kestrel-model/tests/gpu_embeddings.rs).
    assert.deepEqual(r.gpuInfo, { kind: 'embedding', backend: 'webgpu', reason: null, gpu: true });
    for (const [i, expected] of LLAMA_CPP.cases.entries()) {
      const got = r.gpuAll.data[i].embedding;
      assert.ok(cosine(got, expected.vector) >= 0.999, `WebGPU: ${JSON.stringify(expected.text)}: cosine ${cosine(got, expected.vector)} with llama.cpp's`);
      assert.ok(cosine(got, r.all.data[i].embedding) >= 0.9999, `WebGPU: ${JSON.stringify(expected.text)}: cosine with the CPU backend's`);
    }
    assert.deepEqual(r.gpuAll.usage, r.all.usage);
    assert.equal(r.lost, 'device_lost');
    assert.deepEqual(r.statuses, ['device_lost', 'reloading', 'ready']);
    assert.ok(cosine(r.recovered, r.gpuAll.data[0].embedding) > 0.99999, 'the reloaded model embeds as before');
    assert.deepEqual(r.sharedInfo, { kind: 'embedding', backend: 'cpu', mode: 'shared-worker' });
    assert.ok(cosine(r.sharedHello, r.all.data[0].embedding) > 0.99999);

    assert.equal(r.chatKind, 'chat');
    assert.equal(r.refused?.code, 'invalid_option');
    assert.match(r.refused.message, /chat model/);
  });

  // The random-weight models of kestrel-model's embeddings tests, with llama.cpp's vectors of the
  // same texts (`./build.sh` copies both into models/): an encoder per architecture and pooling
  // (bert with CLS and last-token pooling, nomic-bert with mean pooling, in Q8_0, F16 and Q4_0)
  // and a decoder with last-token pooling and EOS after every input (Qwen3-Embedding's shape).
  const SYNTHETIC = [
    { file: 'synthetic-bert-pool2-q8_0.gguf', vectors: 'synthetic-bert-pool2-q8_0.gguf.json', arch: 'bert' },
    { file: 'synthetic-bert-pool3-f16.gguf', vectors: 'synthetic-bert-pool3-f16.gguf.json', arch: 'bert' },
    { file: 'synthetic-nomic-bert-pool1-q4_0.gguf', vectors: 'synthetic-nomic-bert-pool1-q4_0.gguf.json', arch: 'nomic-bert' },
    { file: 'synthetic-qwen3-f32-pooling-3.gguf', vectors: 'synthetic-qwen3-f32-pooling-3.json', arch: 'qwen3' },
  ];
  test('every architecture and pooling embeds the texts as llama.cpp does, on both backends', { timeout: 5 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(5 * MINUTES);
    for (const { file, vectors, arch } of SYNTHETIC) {
      const llama = JSON.parse(readFileSync(join(ROOT, 'models', vectors), 'utf8'));
      const texts = llama.cases.map((c) => c.text);
      for (const backend of ['cpu', 'webgpu']) {
        const r = await page.evaluate(async ({ model, texts, backend }) => {
          const engine = await window.kestrel.createEngine({ model, backend });
          const out = await engine.embeddings.create({ input: texts });
          const { info } = engine;
          await engine.unload();
          return { vectors: out.data.map((d) => d.embedding), usage: out.usage, arch: info.model.arch, kind: info.kind, ran: info.backend, reason: info.backend_reason };
        }, { model: `/models/${file}`, texts, backend });
        const what = `${file} (${backend})`;
        assert.equal(r.arch, arch, what);
        assert.equal(r.kind, 'embedding', what);
        assert.equal(r.ran, backend, what);
        assert.equal(r.reason, backend === 'cpu' ? "backend 'cpu' was asked for" : null, what);
        assert.equal(r.usage.prompt_tokens, llama.cases.reduce((sum, c) => sum + c.tokens.length, 0), `${what}: llama.cpp's token count`);
        llama.cases.forEach((c, i) => {
          const cos = cosine(r.vectors[i], c.vector);
          assert.ok(cos >= 0.999, `${what}: ${JSON.stringify(c.text)}: cosine ${cos} with llama.cpp's vector`);
        });
      }
    }
    await page.close();
  });
});

/**
 * An OpenAI-compatible server that records the embeddings requests it gets and answers each with
 * one vector per input ([index, 1, 0]) and a usage of 3 tokens per input; a request with input
 * "fail" gets OpenAI's error body with status 400.
 */
function recordingServer(pageOrigin) {
  const requests = [];
  const server = createServer((req, res) => {
    res.setHeader('Access-Control-Allow-Origin', pageOrigin);
    res.setHeader('Access-Control-Allow-Headers', 'content-type, authorization');
    if (req.method === 'OPTIONS') return res.end();
    let body = '';
    req.on('data', (chunk) => (body += chunk));
    req.on('end', () => {
      const json = JSON.parse(body);
      requests.push({ method: req.method, url: req.url, authorization: req.headers.authorization, body: json });
      res.setHeader('Content-Type', 'application/json');
      if (json.input === 'fail') {
        res.statusCode = 400;
        return res.end(JSON.stringify({ error: { message: 'input is bad', type: 'invalid_request_error', code: 'invalid_option' } }));
      }
      const inputs = Array.isArray(json.input) ? json.input : [json.input];
      const data = inputs.map((_, index) => ({ object: 'embedding', index, embedding: [index, 1, 0] }));
      res.end(JSON.stringify({ object: 'list', data, model: json.model, usage: { prompt_tokens: 3 * inputs.length, total_tokens: 3 * inputs.length } }));
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${server.address().port}/v1`, requests, close: () => server.close() }));
  });
}

test('a remote engine POSTs embeddings.create to the server\'s /v1/embeddings', { timeout: 5 * MINUTES }, async () => {
  const pages = await startServer();
  const api = await recordingServer(new URL(pages.url).origin);
  // Without WebGPU, `backend: 'webgpu'` falls through to the remote server before any load.
  const browser = await launch({ webgpu: false });
  try {
    const page = await openTestPage(browser.context, pages.url);
    const r = await page.evaluate(async ({ model, baseURL }) => {
      const engine = await window.kestrel.createEngine({ model, remote: { baseURL, apiKey: 'page-key', model: 'minilm' } });
      const codeOf = (promise) => promise.then(() => 'ok', (e) => (e.name === 'KestrelError' ? e.code : e.name));
      const answer = await engine.embeddings.create({ input: ['a', 'b'], dimensions: 2, encoding_format: 'float', truncate: true });
      return {
        backend: engine.info.backend,
        kind: engine.info.kind,
        answer,
        // Refused in the page, as a local engine refuses it: never sent.
        local: await codeOf(engine.embeddings.create({ input: [] })),
        server: await engine.embeddings.create({ input: 'fail' }).catch((e) => ({ code: e.code, remote: e.remote })),
      };
    }, { model: EMBEDDING_MODEL, baseURL: api.url });
    assert.equal(r.backend, 'remote');
    assert.equal(r.kind, null);
    assert.deepEqual(r.answer.data.map((d) => d.embedding), [[0, 1, 0], [1, 1, 0]]);
    assert.deepEqual(r.answer.usage, { prompt_tokens: 6, total_tokens: 6 });
    assert.equal(r.local, 'invalid_option');
    assert.deepEqual(r.server, { code: 'invalid_option', remote: { status: 400, code: 'invalid_option' } });
    assert.deepEqual(api.requests.map((q) => [q.method, q.url, q.authorization]), [['POST', '/v1/embeddings', 'Bearer page-key'], ['POST', '/v1/embeddings', 'Bearer page-key']]);
    assert.deepEqual(api.requests[0].body, { input: ['a', 'b'], dimensions: 2, encoding_format: 'float', truncate: true, model: 'minilm' });
  } finally {
    await browser.close();
    api.close();
    await pages.close();
  }
});
