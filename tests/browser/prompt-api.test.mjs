// Chrome's Prompt API over Kestrel (www/prompt-api.js), in the page, on the CPU backend (wasm SIMD).
// (i) The examples of Chrome's documentation, https://developer.chrome.com/docs/ai/prompt-api, and
// of the Prompt API explainer, https://github.com/webmachinelearning/prompt-api (README.md), run in
// their shape against the adapter installed as `globalThis.LanguageModel` (in place of this
// Chromium's own, which has no model to run): availability, create
// with a monitor and initialPrompts, prompt, promptStreaming, responseConstraint (answers validated
// by Ajv), context usage, aborting, clone, destroy, and the errors the spec names.
// (ii) Over an existing engine: a greedy session (topK 1) answers as the package's own
// engine.chat.completions.create with temperature 0 on the same messages, streamed too; its
// contextUsage and measureContextUsage add up to the engine's usage; a clone is independent; a
// prompt past the context drops the oldest turn (contextoverflow) or fails with QuotaExceededError.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import Ajv from 'ajv';
import { CONTEXT_LENGTH, MINUTES, MODEL_URL, openTestPage, serveAndLaunch } from './harness.mjs';

/** The explainer's structured-output schema (README.md, "Structured output"). */
const RATING = { type: 'object', required: ['rating'], additionalProperties: false, properties: { rating: { type: 'number', minimum: 0, maximum: 5 } } };

describe('Prompt API (LanguageModel) over Kestrel in Chromium', { timeout: 30 * MINUTES }, () => {
  const env = serveAndLaunch();

  test("(i) Chrome's documented examples run against the installed LanguageModel", { timeout: 15 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(10 * MINUTES);
    const r = await page.evaluate(async ({ model, contextLength, rating }) => {
      const { installLanguageModel } = await import('/www/prompt-api.js');
      const source = { model, backend: 'cpu', context_length: contextLength, maxTokens: 24 };
      // This Chromium has a LanguageModel of its own without a model to run ('unavailable'):
      // installing replaces it.
      const native = globalThis.LanguageModel;
      const out = { native: typeof native, nativeAvailability: native && await native.availability() };
      out.replacedNative = native !== undefined && (await installLanguageModel(source)) === globalThis.LanguageModel && globalThis.LanguageModel !== native;
      // A browser's own that can run ('downloadable' here, a stand-in for it) is kept.
      const runnable = { availability: async () => 'downloadable' };
      globalThis.LanguageModel = runnable;
      out.keptRunnable = (await installLanguageModel(source)) === runnable && globalThis.LanguageModel === runnable;
      // Where the browser has none, installing sets the adapter as LanguageModel.
      delete globalThis.LanguageModel;
      out.installed = (await installLanguageModel(source)) === globalThis.LanguageModel && globalThis.LanguageModel !== native && globalThis.LanguageModel !== runnable;
      const error = (p) => p.then(() => 'resolved', (e) => e.name);

      // "const availability = await LanguageModel.availability();"
      out.before = await LanguageModel.availability();
      out.audio = await LanguageModel.availability({ expectedInputs: [{ type: 'audio' }] });
      out.params = await LanguageModel.params();
      out.illegal = (() => { try { new LanguageModel(); return 'constructed'; } catch (e) { return e.name; } })();

      // create() with a download monitor and the documentation's initial prompts (N-shot).
      const progress = [];
      const creating = LanguageModel.create({
        monitor(m) {
          m.addEventListener('downloadprogress', (e) => {
            progress.push(e.loaded);
          });
        },
        initialPrompts: [
          { role: 'system', content: 'You are a helpful and friendly assistant.' },
          { role: 'user', content: 'What is the capital of Italy?' },
          { role: 'assistant', content: 'The capital of Italy is Rome.' },
        ],
      });
      out.during = await LanguageModel.availability();
      const session = await creating;
      out.after = await LanguageModel.availability();
      out.progress = progress;
      out.initialUsage = session.contextUsage;

      // "const result = await session.prompt('Write me a poem!');"
      const result = await session.prompt('Write me a poem!');
      out.result = result;
      out.usageAfterPrompt = session.contextUsage;

      // "const stream = session.promptStreaming('Write me an extra-long poem!');"
      const stream = session.promptStreaming('Write me an extra-long poem!');
      out.chunks = [];
      for await (const chunk of stream) out.chunks.push(chunk);
      out.usageAfterStream = session.contextUsage;

      // Structured output: the documentation's boolean schema, the explainer's rating schema, and
      // the explainer's RegExp.
      // On a session with topK 1 (the documentation's create({ topK, temperature })): at the default
      // sampling a number may run past the adapter's maxTokens here (24), and the text would not parse.
      const greedy = await LanguageModel.create({ topK: 1, temperature: 1 });
      const schema = { type: 'boolean' };
      const post = 'Mugs and ramen bowls, both a bit smaller than intended, but that happens with reclaimed clay. Ceramics #wheelthrowing #pottery #ceramics #handmade';
      out.pottery = await greedy.prompt(`Is this post about pottery?\n\n${post}`, { responseConstraint: schema });
      const feedback = 'Summarize this feedback into a rating between 0-5: The food was delicious, service was excellent, will recommend.';
      out.rating = await greedy.prompt(feedback, { responseConstraint: rating });
      out.ratingOmitted = await greedy.prompt(feedback, { responseConstraint: rating, omitResponseConstraintInput: true });
      const phone = /^[0-9]{3}-[0-9]{4}$/;
      out.phone = await session.prompt('Make up a phone number.', { responseConstraint: phone });
      // The constraint is shown to the model unless omitted, which measureContextUsage counts.
      out.measurePlain = await session.measureContextUsage(feedback);
      out.measureShown = await session.measureContextUsage(feedback, { responseConstraint: rating });
      out.measureOmitted = await session.measureContextUsage(feedback, { responseConstraint: rating, omitResponseConstraintInput: true });
      out.omitAlone = await error(session.measureContextUsage(feedback, { omitResponseConstraintInput: true }));
      out.badConstraint = await error(session.prompt('x', { responseConstraint: 'a string' }));

      // "console.log(`${session.contextUsage}/${session.contextWindow}`);" and the older names.
      out.usage = { contextUsage: session.contextUsage, contextWindow: session.contextWindow, inputUsage: session.inputUsage, inputQuota: session.inputQuota };
      out.measureOld = await session.measureInputUsage(feedback);

      // Aborting a prompt: before it ran, and a stream after its first chunk; the conversation stays.
      const before = session.contextUsage;
      const controller = new AbortController();
      const aborted = session.prompt('Write me a poem!', { signal: controller.signal });
      controller.abort();
      out.abortPrompt = await error(aborted);
      const streamController = new AbortController();
      const reader = session.promptStreaming('Write me an extra-long poem!', { signal: streamController.signal }).getReader();
      out.firstChunk = (await reader.read()).value;
      streamController.abort();
      out.abortStream = await reader.read().then(() => 'read', (e) => e.name);
      out.usageAfterAborts = session.contextUsage;
      out.usageBeforeAborts = before;
      out.afterAbort = typeof (await session.prompt('Still there?'));

      // What Kestrel cannot do rejects as the spec says.
      out.image = await error(session.prompt([{ role: 'user', content: [{ type: 'text', value: 'What is this?' }, { type: 'image', value: new Blob() }] }]));
      out.createImage = await error(LanguageModel.create({ expectedInputs: [{ type: 'image' }] }));
      out.lateSystem = await error(session.prompt([{ role: 'system', content: 'Be brief.' }]));
      out.prefix = await error(session.prompt([{ role: 'user', content: 'A TOML sheet' }, { role: 'assistant', content: '```toml\n', prefix: true }]));
      out.badTemperature = await error(LanguageModel.create({ temperature: -1 }));

      // "const clonedSession = await session.clone({ signal: controller.signal });"
      const cloneController = new AbortController();
      const clonedSession = await session.clone({ signal: cloneController.signal });
      out.cloneUsage = clonedSession.contextUsage;
      out.sessionUsage = session.contextUsage;
      await clonedSession.prompt('Tell me a joke.');
      out.cloneUsageAfter = clonedSession.contextUsage;
      out.sessionUsageAfterClone = session.contextUsage;

      // "session.destroy();": what runs and what comes after reject.
      const pending = clonedSession.prompt('Write me a poem!');
      clonedSession.destroy();
      out.destroyPending = await error(pending);
      out.destroyAfter = await error(clonedSession.prompt('What should I wear today?'));
      out.destroyStream = await clonedSession.promptStreaming('Write me a poem!').getReader().read().then(() => 'read', (e) => e.name);
      out.destroyedWindow = typeof clonedSession.contextWindow;
      out.originalAfterDestroy = typeof (await session.prompt('Hello?'));
      return out;
    }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH, rating: RATING });
    console.log(JSON.stringify(r, null, 1));

    assert.equal(r.native, 'function');
    assert.equal(r.nativeAvailability, 'unavailable', "Chromium's own has no model here");
    assert.ok(r.replacedNative, 'installLanguageModel replaces a browser\'s own that cannot run');
    assert.ok(r.keptRunnable, 'installLanguageModel keeps a browser\'s own that can run');
    assert.ok(r.installed);
    assert.equal(r.before, 'downloadable');
    assert.equal(r.audio, 'unavailable');
    assert.deepEqual(Object.keys(r.params).sort(), ['defaultTemperature', 'defaultTopK', 'maxTemperature', 'maxTopK']);
    assert.equal(r.illegal, 'TypeError');
    assert.equal(r.during, 'downloading');
    assert.equal(r.after, 'available');
    assert.equal(r.progress[0], 0);
    assert.equal(r.progress.at(-1), 1);
    assert.ok(r.progress.some((p) => p > 0 && p < 1), `fractions in between: ${r.progress}`);
    assert.ok(r.progress.every((p, i) => i === 0 || p > r.progress[i - 1]), 'progress only grows');
    assert.ok(r.initialUsage > 0, 'the initial prompts use context');

    assert.equal(typeof r.result, 'string');
    assert.ok(r.usageAfterPrompt > r.initialUsage);
    assert.ok(r.chunks.length > 1 && r.chunks.every((c) => typeof c === 'string' && c.length > 0));
    // Deltas, not the growing text (which Chrome streamed before version 137).
    assert.ok(r.chunks.slice(1).some((c, i) => !c.startsWith(r.chunks[i])), `chunks are deltas: ${JSON.stringify(r.chunks)}`);
    assert.ok(r.usageAfterStream > r.usageAfterPrompt);

    const ajv = new Ajv({ strict: false });
    assert.equal(typeof JSON.parse(r.pottery), 'boolean', r.pottery);
    for (const text of [r.rating, r.ratingOmitted]) {
      const validate = ajv.compile(RATING);
      assert.ok(validate(JSON.parse(text)), `${text}: ${ajv.errorsText(validate.errors)}`);
    }
    assert.match(r.phone, /^[0-9]{3}-[0-9]{4}$/);
    assert.ok(r.measureShown > r.measurePlain, 'the shown constraint uses context');
    assert.equal(r.measureOmitted, r.measurePlain);
    assert.equal(r.omitAlone, 'TypeError');
    assert.equal(r.badConstraint, 'TypeError');

    assert.equal(r.usage.contextWindow, CONTEXT_LENGTH);
    assert.equal(r.usage.inputQuota, CONTEXT_LENGTH);
    assert.equal(r.usage.inputUsage, r.usage.contextUsage);
    assert.equal(r.measureOld, r.measurePlain);

    assert.equal(r.abortPrompt, 'AbortError');
    assert.equal(typeof r.firstChunk, 'string');
    assert.equal(r.abortStream, 'AbortError');
    assert.equal(r.usageAfterAborts, r.usageBeforeAborts, 'aborted prompts leave the conversation as it was');
    assert.equal(r.afterAbort, 'string');

    assert.equal(r.image, 'NotSupportedError');
    assert.equal(r.createImage, 'NotSupportedError');
    assert.equal(r.lateSystem, 'TypeError');
    assert.equal(r.prefix, 'NotSupportedError');
    assert.equal(r.badTemperature, 'RangeError');

    assert.equal(r.cloneUsage, r.sessionUsage);
    assert.ok(r.cloneUsageAfter > r.cloneUsage);
    assert.equal(r.sessionUsageAfterClone, r.sessionUsage, 'prompting the clone leaves the original as it was');

    assert.equal(r.destroyPending, 'InvalidStateError');
    assert.equal(r.destroyAfter, 'InvalidStateError');
    assert.equal(r.destroyStream, 'InvalidStateError');
    assert.equal(r.destroyedWindow, 'number');
    assert.equal(r.originalAfterDestroy, 'string', 'destroying a clone leaves the original working');
    await page.close();
  });

  test('(ii) greedy answers and token counts are the engine\'s own; overflow drops old turns or fails with QuotaExceededError', { timeout: 15 * MINUTES }, async () => {
    const page = await openTestPage(env.browser.context, env.server.url);
    page.setDefaultTimeout(10 * MINUTES);
    const r = await page.evaluate(async ({ model, contextLength }) => {
      const { createLanguageModel } = await import('/www/prompt-api.js');
      const { createEngine } = await import('/www/index.js');
      const engine = await createEngine({ model, backend: 'cpu', context_length: contextLength });
      const MAX = 12;
      const LM = createLanguageModel({ engine, maxTokens: MAX });
      const direct = async (messages, max_tokens = MAX) => {
        const c = await engine.chat.completions.create({ messages, max_tokens, temperature: 0 });
        return { text: c.choices[0].message.content, prompt: c.usage.prompt_tokens, completion: c.usage.completion_tokens };
      };
      const out = { window: engine.info.model.context_length, available: await LM.availability() };
      const initialPrompts = [
        { role: 'system', content: 'You are a helpful and friendly assistant.' },
        { role: 'user', content: 'What is the capital of Italy?' },
        { role: 'assistant', content: 'The capital of Italy is Rome.' },
      ];
      const q1 = 'What language is spoken there?';
      const q2 = 'How many people live there?';
      const session = await LM.create({ topK: 1, initialPrompts });
      out.topK = session.topK;
      out.initialUsage = session.contextUsage;
      out.initialDirect = (await direct(initialPrompts, 1)).prompt;
      out.measure = await session.measureContextUsage(q1);
      const clone = await session.clone();
      out.answer = await session.prompt(q1);
      out.usage = session.contextUsage;
      out.direct = await direct([...initialPrompts, { role: 'user', content: q1 }]);
      // The clone streams the same greedy answer, and prompting it leaves the original alone.
      out.streamed = [];
      for await (const chunk of clone.promptStreaming(q1)) out.streamed.push(chunk);
      out.cloneUsage = clone.contextUsage;
      await clone.prompt('And in France?');
      out.usageAfterClone = session.contextUsage;
      out.next = await session.prompt(q2);
      out.nextDirect = await direct([...initialPrompts, { role: 'user', content: q1 }, { role: 'assistant', content: out.answer }, { role: 'user', content: q2 }]);
      out.nextUsage = session.contextUsage;
      // append() reads messages without an answer; the next prompt follows them.
      await session.append([{ role: 'user', content: 'Remember the number 7.' }]);
      out.appendUsage = session.contextUsage;
      out.appendDirect = (await direct([...initialPrompts, { role: 'user', content: q1 }, { role: 'assistant', content: out.answer }, { role: 'user', content: q2 }, { role: 'assistant', content: out.next }, { role: 'user', content: 'Remember the number 7.' }], 1)).prompt;

      // Overflow: a prompt that fits only without the oldest turn drops it (contextoverflow).
      // create()'s signal: an aborted one rejects, aborting it later destroys the session.
      out.createAborted = await LM.create({ signal: AbortSignal.abort() }).then(() => 'resolved', (e) => e.name);
      const createController = new AbortController();
      const doomed = await LM.create({ signal: createController.signal });
      createController.abort();
      out.destroyedBySignal = await doomed.prompt('Hi').then(() => 'resolved', (e) => e.name);
      // A loaded engine still reports its progress: 0, then 1.
      out.progress = [];
      const small = await LM.create({
        topK: 1,
        initialPrompts: [initialPrompts[0]],
        monitor(m) {
          m.ondownloadprogress = (e) => out.progress.push(e.loaded);
        },
      });
      await small.prompt('Tell me a joke.');
      let events = 0;
      let quotaEvents = 0;
      small.addEventListener('contextoverflow', () => events++);
      small.onquotaoverflow = () => quotaEvents++;
      const words = (n) => 'word '.repeat(n);
      const m100 = await small.measureContextUsage(words(100));
      const m200 = await small.measureContextUsage(words(200));
      const perWord = (m200 - m100) / 100;
      const n = Math.ceil((out.window - small.contextUsage - (m100 - 100 * perWord) + 4) / perWord);
      out.fill = { usage: small.contextUsage, measure: await small.measureContextUsage(words(n)) };
      out.fillAnswer = typeof (await small.prompt(words(n)));
      out.events = events;
      out.quotaEvents = quotaEvents;
      out.fillUsage = small.contextUsage;
      // A prompt over the whole context fails, and nothing is dropped.
      const huge = words(2 * out.window);
      out.hugeMeasure = await small.measureContextUsage(huge);
      out.hugeUsage = small.contextUsage;
      out.huge = await small.prompt(huge).then(() => null, (e) => ({ name: e.name, isDOMException: e instanceof DOMException, requested: e.requested, quota: e.quota }));
      out.afterHugeUsage = small.contextUsage;
      out.eventsAfterHuge = events;
      out.afterHuge = typeof (await small.prompt('Hi'));
      await engine.unload();
      return out;
    }, { model: MODEL_URL, contextLength: CONTEXT_LENGTH });
    console.log(JSON.stringify(r, null, 1));

    assert.equal(r.available, 'available');
    assert.equal(r.topK, 1);
    assert.equal(r.initialUsage, r.initialDirect, "contextUsage after create is the engine's prompt_tokens of the initial prompts");
    assert.equal(r.answer, r.direct.text, 'the greedy prompt answers as engine.chat.completions.create');
    assert.ok(r.direct.completion > 0);
    assert.equal(r.initialUsage + r.measure, r.direct.prompt, 'contextUsage + measureContextUsage is the next request\'s prompt_tokens');
    assert.equal(r.usage, r.direct.prompt + r.direct.completion, 'contextUsage after a prompt is the engine\'s prompt and completion tokens');
    assert.ok(r.streamed.length > 1);
    assert.equal(r.streamed.join(''), r.answer, 'the stream\'s deltas make the same answer');
    assert.equal(r.cloneUsage, r.usage);
    assert.equal(r.usageAfterClone, r.usage, 'the clone is independent');
    assert.equal(r.next, r.nextDirect.text, 'the second turn answers as the engine on the whole conversation');
    assert.equal(r.nextUsage, r.nextDirect.prompt + r.nextDirect.completion);
    assert.equal(r.appendUsage, r.appendDirect, 'append() counts as the engine');

    assert.equal(r.createAborted, 'AbortError');
    assert.equal(r.destroyedBySignal, 'AbortError');
    assert.deepEqual(r.progress, [0, 1]);
    assert.ok(r.fill.usage + r.fill.measure >= r.window, `the filler overflows: ${JSON.stringify(r.fill)}`);
    assert.equal(r.fillAnswer, 'string');
    assert.equal(r.events, 1, 'contextoverflow fired');
    assert.equal(r.quotaEvents, 1, 'onquotaoverflow, its older name, too');
    assert.ok(r.fillUsage <= r.window);
    assert.equal(r.huge?.name, 'QuotaExceededError');
    assert.ok(r.huge.isDOMException);
    assert.equal(r.huge.quota, r.window);
    assert.equal(r.huge.requested, r.hugeUsage + r.hugeMeasure + 1, 'requested: the prompt and the answer\'s first token');
    assert.equal(r.afterHugeUsage, r.hugeUsage, 'nothing dropped');
    assert.equal(r.eventsAfterHuge, 1);
    assert.equal(r.afterHuge, 'string');
    await page.close();
  });
});
