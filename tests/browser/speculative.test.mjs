// Speculative decoding in the page (createEngine's `speculative` and `draftModel`), on the wasm
// CPU backend and on WebGPU: a greedy request gives the tokens it gives with `speculative: false`,
// by prompt lookup and with a draft model (the model as its own draft: its greedy drafts stand);
// `engine.info.speculative` says how the engine speculates, `kestrel.speculative` what a request
// drafted and kept. On WebGPU the verification runs the prefill kernels, which round differently
// from the decode kernels: the tokens may part only where plain decoding's top-2 margin is under
// 0.02 (as natively on lavapipe). The CPU backend's fit check counts the draft model. Few tokens:
// wasm runs the default model's 30 layers on one thread.
// (A draft of another vocabulary is refused by the engine, tested natively in
// crates/kestrel-model/tests/speculative.rs; here the same path refuses an embedding model.)
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, SMALL_MODEL_URL, openTestPage, serveAndLaunch } from './harness.mjs';

const EMBEDDING_MODEL = '/models/all-MiniLM-L6-v2.f32.gguf';

describe('Speculative decoding in Chromium', { timeout: 20 * MINUTES }, () => {
  const env = serveAndLaunch();

  test('on the CPU backend, prompt lookup and a draft model give the plain greedy tokens', { timeout: 15 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(12 * MINUTES);
    const r = await page.evaluate(async ({ model, embedding, contextLength }) => {
      const { createEngine, estimate } = window.kestrel;
      const failure = (p) => p.then(() => null, (e) => ({ code: e.code, message: e.message }));
      // An answer that repeats its prompt, where lookup drafts.
      const messages = [{ role: 'user', content: 'Repeat exactly: the quick brown fox jumps over the lazy dog.' }];
      const ask = { messages, temperature: 0, max_tokens: 10, ignore_eos: true };
      /** The same request plainly, then speculatively: each answer's details. */
      const both = async (engine) => {
        const plain = await engine.chat.completions.create({ ...ask, speculative: false });
        const spec = await engine.chat.completions.create(ask);
        return { plain: plain.kestrel, spec: spec.kestrel, texts: [plain.choices[0].message.content, spec.choices[0].message.content] };
      };
      const options = { model, backend: 'cpu', context_length: contextLength };

      const lookupEngine = await createEngine({ ...options, speculative: { lookup: true, maxDraft: 8 } });
      const lookup = { info: lookupEngine.info.speculative, ...(await both(lookupEngine)) };
      await lookupEngine.unload();

      const progress = [];
      const draftEngine = await createEngine({ ...options, draftModel: model, onProgress: (p) => progress.push(p) });
      const draft = { info: draftEngine.info.speculative, ...(await both(draftEngine)) };
      await draftEngine.unload();

      const alone = await estimate({ model, context_length: contextLength });
      const withDraft = await estimate({ model, context_length: contextLength, draftModel: model });
      return {
        lookup,
        draft,
        draftProgress: progress.filter((p) => p.draft).map((p) => p.phase),
        estimate: { alone: alone.cpu, withDraft: withDraft.cpu },
        badMaxDraft: await failure(createEngine({ ...options, speculative: { lookup: true, maxDraft: 17 } })),
        nothingDrafts: await failure(createEngine({ ...options, speculative: { maxDraft: 4 } })),
        // Refused by the estimate before a download, or by the draft's load where the model comes
        // from the Cache API (no fit check then).
        embeddingEstimate: await failure(estimate({ model, draftModel: embedding })),
        embeddingDraft: await failure(createEngine({ ...options, draftModel: embedding })),
      };
    }, { model: MODEL_URL, embedding: EMBEDDING_MODEL, contextLength: CONTEXT_LENGTH });
    console.log(`lookup: ${JSON.stringify(r.lookup.spec.speculative)}; draft model: ${JSON.stringify(r.draft.spec.speculative)}`);

    assert.deepEqual(r.lookup.info, { enabled: true, lookup: true, maxDraft: 8, draftModel: null });
    assert.deepEqual(r.draft.info, { enabled: true, lookup: false, maxDraft: 16, draftModel: r.draft.info.draftModel });
    assert.ok(r.draft.info.draftModel, 'the draft model is named');
    for (const [name, run] of Object.entries({ lookup: r.lookup, draft: r.draft })) {
      assert.equal(run.plain.speculative, undefined, `${name}: speculative: false is plain decoding`);
      assert.deepEqual(run.spec.token_ids, run.plain.token_ids, `${name}: speculative tokens differ from plain decoding's`);
      assert.equal(run.texts[1], run.texts[0]);
      assert.ok(run.spec.speculative, `${name}: speculation served the request`);
    }
    const stats = r.draft.spec.speculative;
    assert.ok(stats.drafted > 0 && stats.verifications > 0, JSON.stringify(stats));
    assert.equal(stats.accepted, stats.drafted, "the model's own greedy drafts all stand");
    assert.deepEqual([...new Set(r.draftProgress)].slice(-2), ['compile', 'ready'], 'the draft model reports its own load');

    const { alone, withDraft } = r.estimate;
    assert.equal(alone.draft_bytes, 0);
    assert.ok(withDraft.draft_bytes > alone.weight_bytes, JSON.stringify(withDraft));
    assert.equal(withDraft.bytes, alone.bytes + withDraft.draft_bytes);
    assert.equal(withDraft.fits, true);

    assert.equal(r.badMaxDraft?.code, 'invalid_option');
    assert.match(r.badMaxDraft.message, /speculative\.maxDraft/);
    assert.equal(r.nothingDrafts?.code, 'invalid_option');
    for (const refused of [r.embeddingEstimate, r.embeddingDraft]) {
      assert.equal(refused?.code, 'invalid_option');
      assert.match(refused.message, /embedding model/);
    }
    await page.close();
  });

  test('on WebGPU prompt lookup and a draft model give the plain greedy tokens up to a near-tie', { timeout: 10 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(8 * MINUTES);
    const r = await page.evaluate(async ({ model, contextLength }) => {
      const engine = await window.kestrel.createEngine({
        model, draftModel: model, backend: 'webgpu', context_length: contextLength, speculative: { lookup: true, maxDraft: 4 },
      });
      const prompt = 'one two three four five six. one two three four five six. one two';
      const request = { prompt, temperature: 0, max_tokens: 8, ignore_eos: true };
      const plain = await engine.completions.create({ ...request, speculative: false, logprobs: 2 });
      const spec = await engine.completions.create(request);
      const { backend, speculative } = engine.info;
      await engine.unload();
      const margins = plain.choices[0].logprobs.top_logprobs.map((top) => {
        const [a, b] = Object.values(top).sort((x, y) => y - x);
        return a - b;
      });
      return { backend, speculative, plain: plain.kestrel.token_ids, spec: spec.kestrel.token_ids, margins, stats: spec.kestrel.speculative ?? null };
    }, { model: SMALL_MODEL_URL, contextLength: CONTEXT_LENGTH });
    assert.equal(r.backend, 'webgpu');
    assert.equal(r.speculative.enabled, true);
    assert.equal(r.speculative.lookup, true);
    assert.ok(r.speculative.draftModel, 'the draft model is named');
    assert.ok(r.stats && r.stats.drafted > 0, `drafts were verified: ${JSON.stringify(r.stats)}`);
    const parted = r.plain.findIndex((t, i) => t !== r.spec[i]);
    if (parted >= 0) {
      console.log(`WebGPU: speculative and plain tokens part at step ${parted}, plain margin ${r.margins[parted]}`);
      assert.ok(r.margins[parted] < 0.02, `they part at step ${parted} with a margin of ${r.margins[parted]}`);
    } else {
      assert.equal(r.spec.length, r.plain.length);
    }
    await page.close();
  });
});
