// The shared engine (createEngine({ shared: true })): three tabs of one browser share one engine.
// Its GPU buffers are those of one engine; the tabs' concurrent greedy requests give what each
// gives alone; a tab closed mid-stream ends only its own request; and with SharedWorker taken
// away (the Web Locks + BroadcastChannel path of Chrome on Android), closing the leading tab hands
// the engine over: the request in flight fails with `leader_lost`, a retry answers, and onStatus
// says 'leader_lost', 'reloading', 'ready' in each remaining tab.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CONTEXT_LENGTH, gpuProcessBytes, MINUTES, MODEL_URL, openTestPage, serveAndLaunch, SMALL_MODEL_URL } from './harness.mjs';

/** A chat request per tab, greedy; the tabs ask different things so that a mix-up shows. */
const QUESTIONS = ['Name a colour.', 'What is two plus two?', 'Say hello in French.'];
const request = (content, max_tokens = 16) => ({ messages: [{ role: 'user', content }], temperature: 0, max_tokens });

/** Opens a test page; `noSharedWorker` takes SharedWorker away before the package runs. */
function openTab(env, options) {
  return openTestPage(env.browser.context, env.server.url, options);
}

/**
 * Creates the tab's engine (kept as window.engine, its onStatus events in window.statuses) and
 * returns its info. `options.model` overrides the default model.
 */
function createEngine(page, options) {
  return page.evaluate(async ({ model, options }) => {
    window.statuses = [];
    window.engine = await window.kestrel.createEngine({
      model,
      ...options,
      onStatus: (s) => {
        window.statuses.push(s.status);
        // A request made the moment the leader is lost (window.askOnLoss, from this callback)
        // waits for the next leader: neither lost with the old one nor sent to a tab taking over
        // before its worker runs.
        if (s.status === 'leader_lost' && window.askOnLoss) {
          window.answerOnLoss = window.engine.chat.completions.create(window.askOnLoss).then(
            (out) => ({ text: out.choices[0].message.content, ids: out.kestrel.token_ids }),
            (e) => ({ code: e.code }),
          );
        }
      },
    });
    return window.engine.info;
  }, { model: options.model ?? MODEL_URL, options });
}

/** The tab's greedy answer (text and token ids) to `q`. */
function ask(page, q) {
  return page.evaluate(async (q) => {
    const out = await window.engine.chat.completions.create(q);
    return { text: out.choices[0].message.content, ids: out.kestrel.token_ids };
  }, q);
}

/**
 * The tab's greedy answer to `q` after a leader changed: a request that reached the closed leader
 * before this tab learnt of it fails with `leader_lost`, and is asked again, as the API says.
 */
async function askAgain(page, q) {
  for (let attempt = 0; ; attempt++) {
    const out = await page.evaluate(async (q) => {
      try {
        const out = await window.engine.chat.completions.create(q);
        return { text: out.choices[0].message.content, ids: out.kestrel.token_ids };
      } catch (e) {
        return { code: e.code };
      }
    }, q);
    if (out.code !== 'leader_lost' || attempt === 2) return out;
  }
}

/** Waits until the tab's engine says `clients` tabs use it; returns its info.shared. */
async function waitForClients(page, clients) {
  await page.waitForFunction((n) => window.engine.info.shared?.clients === n, clients, { timeout: MINUTES });
  return page.evaluate(() => window.engine.info.shared);
}

describe('The shared engine in Chromium', { timeout: 30 * MINUTES }, () => {
  const env = serveAndLaunch();

  test('(webgpu) three tabs hold one engine\'s GPU buffers', { timeout: 10 * MINUTES }, async () => {
    // The small model: what is checked is the sharing.
    const options = { backend: 'webgpu', context_length: CONTEXT_LENGTH, shared: true, model: SMALL_MODEL_URL };
    const tabs = [];
    const gpuProcess = [];
    for (let k = 0; k < 3; k++) {
      tabs.push(await openTab(env));
      const info = await createEngine(tabs[k], options);
      assert.equal(info.backend, 'webgpu');
      assert.equal(info.shared.mode, 'shared-worker');
      gpuProcess.push(gpuProcessBytes(env.browser));
    }
    assert.deepEqual(await waitForClients(tabs[0], 3), { mode: 'shared-worker', clients: 3, abandoned_requests: 0 });
    const memories = await Promise.all(tabs.map((t) => t.evaluate(() => window.engine.memory())));
    // Few tokens: each is slow on SwiftShader, and the CPU tests below compare longer answers.
    const sharedAnswer = await ask(tabs[2], request(QUESTIONS[0], 4));

    // The same engine unshared, in a tab of its own: the buffers one engine holds.
    const alone = await openTab(env);
    await createEngine(alone, { backend: 'webgpu', context_length: CONTEXT_LENGTH, model: SMALL_MODEL_URL });
    const one = await alone.evaluate(() => window.engine.memory());
    const aloneAnswer = await ask(alone, request(QUESTIONS[0], 4));
    gpuProcess.push(gpuProcessBytes(env.browser));
    const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;
    console.log(`GPU buffers of the shared engine: ${memories.map((m) => m.gpu_buffer_bytes).join(', ')} bytes (each tab's view); one unshared engine: ${one.gpu_buffer_bytes}. `
      + `GPU process: ${mib(gpuProcess[0])} with 1 shared tab, ${mib(gpuProcess[1])} with 2, ${mib(gpuProcess[2])} with 3, ${mib(gpuProcess[3])} with an unshared engine beside them`);
    // The GPU process holds the buffers (SwiftShader): tabs 2 and 3 add far less than an engine.
    assert.ok(gpuProcess[2] - gpuProcess[0] < one.gpu_buffer_bytes / 2, 'tabs joining add no engine to the GPU process');
    for (const m of memories) {
      assert.equal(m.gpu_buffer_bytes, memories[0].gpu_buffer_bytes, 'every tab sees the one engine');
      // Within 1%: a worker without requestAnimationFrame (a SharedWorker) sizes its prompt
      // submissions by another frame interval, a few bytes of uniforms; three engines would be 3x.
      assert.ok(Math.abs(m.gpu_buffer_bytes - one.gpu_buffer_bytes) < one.gpu_buffer_bytes / 100, 'the shared engine holds what one engine holds');
    }
    assert.deepEqual(sharedAnswer, aloneAnswer);
    for (const t of [...tabs, alone]) await t.close();
  });

  test('(cpu) concurrent greedy requests of three tabs give what each gives alone; a tab closed mid-stream ends only its own', { timeout: 15 * MINUTES }, async () => {
    const options = { backend: 'cpu', context_length: CONTEXT_LENGTH, slots: 4, shared: true };
    const alone = await openTab(env);
    await createEngine(alone, { backend: 'cpu', context_length: CONTEXT_LENGTH });
    const expected = [];
    for (const q of QUESTIONS) expected.push(await ask(alone, request(q)));
    await alone.close();

    const tabs = [];
    for (let k = 0; k < 3; k++) {
      tabs.push(await openTab(env));
      await createEngine(tabs[k], options);
    }
    await waitForClients(tabs[0], 3);
    const together = await Promise.all(tabs.map((t, k) => ask(t, request(QUESTIONS[k]))));
    assert.deepEqual(together, expected);

    // Tab 0 streams a long answer and closes after its first tokens, while tabs 1 and 2 ask theirs.
    await tabs[0].evaluate(() => {
      window.streamed = 0;
      (async () => {
        for await (const _ of await window.engine.chat.completions.create({ messages: [{ role: 'user', content: 'Tell a long story.' }], temperature: 0, max_tokens: 400, stream: true })) window.streamed++;
      })();
    });
    await tabs[0].waitForFunction(() => window.streamed >= 2);
    const others = tabs.slice(1).map((t, k) => ask(t, request(QUESTIONS[k + 1])));
    await tabs[0].close();
    assert.deepEqual(await Promise.all(others), expected.slice(1));
    const shared = await waitForClients(tabs[1], 2);
    assert.equal(shared.abandoned_requests, 1, 'the closed tab\'s stream was ended');
    for (const t of tabs.slice(1)) await t.close();
  });

  test('(cpu, without SharedWorker) a leading tab runs the engine; when it closes another takes over', { timeout: 15 * MINUTES }, async () => {
    // Another context length: another engine than the tests before, whatever is left of theirs.
    const options = { backend: 'cpu', context_length: CONTEXT_LENGTH - 64, slots: 2, shared: true };
    const tabs = [];
    for (let k = 0; k < 3; k++) {
      tabs.push(await openTab(env, { noSharedWorker: true }));
      const info = await createEngine(tabs[k], options);
      assert.equal(info.shared.mode, k === 0 ? 'leader' : 'follower');
    }
    await waitForClients(tabs[2], 3);
    const first = await ask(tabs[1], request(QUESTIONS[1]));
    assert.deepEqual(await ask(tabs[0], request(QUESTIONS[1])), first, 'a follower gets what the leader gets');

    // Tab 1 streams; the leader closes under it.
    await tabs[1].evaluate(() => {
      window.streamed = 0;
      window.streamEnd = (async () => {
        try {
          for await (const _ of await window.engine.chat.completions.create({ messages: [{ role: 'user', content: 'Tell a long story.' }], temperature: 0, max_tokens: 400, stream: true })) window.streamed++;
          return 'finished';
        } catch (e) {
          return e.code;
        }
      })();
    });
    await tabs[1].waitForFunction(() => window.streamed >= 2);
    for (const t of tabs.slice(1)) await t.evaluate((q) => (window.askOnLoss = q), request(QUESTIONS[1]));
    await tabs[0].close();
    assert.equal(await tabs[1].evaluate(() => window.streamEnd), 'leader_lost');
    // Bounded: a request lost in the hand-over would otherwise wait for the test's timeout.
    for (const t of tabs.slice(1)) {
      const answer = await t.evaluate((ms) => Promise.race([window.answerOnLoss, new Promise((r) => setTimeout(() => r({ code: `no answer in ${ms} ms` }), ms))]), 2 * MINUTES);
      assert.deepEqual(answer, first, 'a request made as the leader was lost is answered by the next one');
    }

    // The next tab in line leads; both tabs' requests run again, with the same answers.
    assert.deepEqual(await askAgain(tabs[1], request(QUESTIONS[1])), first);
    assert.deepEqual(await askAgain(tabs[2], request(QUESTIONS[1])), first);
    await waitForClients(tabs[2], 2);
    const modes = await Promise.all(tabs.slice(1).map((t) => t.evaluate(() => window.engine.info.shared.mode)));
    assert.deepEqual(modes.sort(), ['follower', 'leader']);
    // Both tabs heard the hand-over, the new leader's and the follower's alike.
    for (const t of tabs.slice(1)) {
      await t.waitForFunction(() => window.statuses.length >= 3, null, { timeout: MINUTES });
      assert.deepEqual(await t.evaluate(() => window.statuses), ['leader_lost', 'reloading', 'ready']);
      assert.equal(await t.evaluate(() => window.engine.info.backend), 'cpu');
    }
    for (const t of tabs.slice(1)) await t.close();
  });
});
