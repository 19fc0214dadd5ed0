// The engine survives a crash of its WebAssembly, which after a trap holds undefined state: a Rust
// panic (it aborts: `RuntimeError: unreachable`), a stack overflow, and a panic in a future the
// wasm polls later, as a step's (its promise never settles; the trap is the worker's uncaught
// error). The call that trapped and those in flight fail with `internal`, saying what trapped;
// onStatus says 'crashed', 'reloading', 'ready' while a new worker reloads the model; the next
// request, made at once, waits for it and gets the same greedy answer as before the crash.
// A shared engine recovers in every tab: the SharedWorker closes itself and the tabs start a new
// one; without SharedWorker, the leading tab starts a new worker and the others rejoin it.
// The traps come from the hook of the suite's own build of the wasm (kestrel-wasm's `test-hooks`,
// served here in place of www/pkg); the package's wasm has none (tests/package checks).
// On the tiny random-weight qwen3 model: the recovery does not depend on the model.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CONTEXT_LENGTH, MINUTES, openTestPage, serveAndLaunch, SMALL_MODEL_URL } from './harness.mjs';

const env = serveAndLaunch({ testHooks: true });

/** What each trap's `internal` error says: the trap, and a panic's own message. */
const TRAPS = {
  panic: /RuntimeError: unreachable: kestrel panicked .*the test hook's panic/s,
  // V8's stack ends first; where the stack Rust keeps in wasm memory does, a bad memory access.
  stack_overflow: /RangeError: Maximum call stack size exceeded|RuntimeError: memory access out of bounds/,
  panic_in_future: /RuntimeError: unreachable: kestrel panicked .*the test hook's panic in a future/s,
};

/**
 * Creates the tab's engine (window.engine, its statuses in window.statuses, `window.ask()` its
 * greedy chat answer) and returns its answer and how it reaches a shared engine.
 */
function createEngine(page, options) {
  return page.evaluate(async (options) => {
    window.statuses = [];
    window.engine = await window.kestrel.createEngine({ ...options, onStatus: (s) => window.statuses.push(s.error ? `${s.status}: ${s.error.code}` : s.status) });
    window.ask = async () => (await window.engine.chat.completions.create({ messages: [{ role: 'user', content: 'Name a colour.' }], max_tokens: 4, temperature: 0 })).kestrel.token_ids;
    return { answer: await window.ask(), mode: window.engine.info.shared?.mode ?? null };
  }, options);
}

/** The page's workers once there are `n`, or after 10 s. */
async function workersAfter(page, n) {
  for (let waited = 0; page.workers().length !== n && waited < 10_000; waited += 100) await new Promise((r) => setTimeout(r, 100));
  return page.workers().length;
}

test('a trap fails its call and those in flight with internal; a new worker reloads the model and answers as before', { timeout: 20 * MINUTES }, async () => {
  const page = await openTestPage(env.browser.context, env.server.url);
  page.setDefaultTimeout(15 * MINUTES);
  // Two slots: a stream runs beside the trapping call, which reaches the worker while it runs.
  const { answer: before } = await createEngine(page, { model: SMALL_MODEL_URL, context_length: CONTEXT_LENGTH, slots: 2 });

  for (const [how, says] of Object.entries(TRAPS)) {
    const t0 = Date.now();
    const r = await page.evaluate(async (how) => {
      const stream = await window.engine.completions.create({ prompt: 'the kestrel', max_tokens: 400, ignore_eos: true, stream: true });
      let pieces = 0;
      const streamed = (async () => {
        for await (const _ of stream) pieces++;
      })().then(() => `finished after ${pieces} chunks`, (e) => e.code);
      while (pieces === 0) await new Promise((r) => setTimeout(r, 10));
      const trapped = await window.engine._trap(how).then(() => null, (e) => ({ code: e.code, name: e.name, message: e.message }));
      // At once, before the reload: it waits for it.
      const after = await window.ask();
      return { trapped, stream: await streamed, after, statuses: window.statuses.splice(0) };
    }, how);
    console.log(`${how}: ${JSON.stringify(r)} in ${Date.now() - t0} ms`);
    assert.equal(r.trapped?.name, 'KestrelError');
    assert.equal(r.trapped.code, 'internal');
    assert.match(r.trapped.message, says);
    assert.equal(r.stream, 'internal', 'the stream in flight fails with the crash');
    assert.deepEqual(r.statuses, ['crashed: internal', 'reloading', 'ready']);
    assert.deepEqual(r.after, before, 'the reloaded model gives the same greedy tokens');
    // The crashed worker is gone (its end reaches the page's list a moment after): the new one runs.
    assert.equal(await workersAfter(page, 1), 1);
  }
  assert.equal(await page.evaluate(() => window.engine.info.model.slots), 2, 'the new worker runs the engine the options made');
  await page.evaluate(() => window.engine.unload());
  await page.close();
});

for (const noSharedWorker of [false, true]) {
  const how = noSharedWorker ? "in the leading tab's worker (without SharedWorker)" : 'in a SharedWorker';
  test(`a shared engine ${how}: a trap fails its call with internal; every tab reloads the model and answers as before`, { timeout: 10 * MINUTES }, async () => {
    // The CPU backend: quicker to reload, and the recovery does not depend on the backend. A
    // context length of its own: another engine than the other test's.
    const options = { model: SMALL_MODEL_URL, backend: 'cpu', context_length: CONTEXT_LENGTH - (noSharedWorker ? 64 : 32), shared: true };
    const tabs = [];
    const before = [];
    for (let k = 0; k < 2; k++) {
      tabs.push(await openTestPage(env.browser.context, env.server.url, { noSharedWorker }));
      before.push(await createEngine(tabs[k], options));
    }
    assert.deepEqual(before.map((b) => b.mode), noSharedWorker ? ['leader', 'follower'] : ['shared-worker', 'shared-worker']);
    // The second tab traps the engine: without SharedWorker, a follower, whose leader restarts it.
    const trapped = await tabs[1].evaluate(() => window.engine._trap('panic').then(() => null, (e) => ({ code: e.code, message: e.message })));
    const after = await Promise.all(tabs.map((t) => t.evaluate(() => window.ask())));
    const statuses = await Promise.all(tabs.map((t) => t.evaluate(() => window.statuses)));
    console.log(`shared engine ${how}: ${JSON.stringify({ trapped, statuses })}`);
    assert.equal(trapped?.code, 'internal');
    assert.match(trapped.message, TRAPS.panic);
    for (const [k, answer] of after.entries()) {
      assert.deepEqual(statuses[k], ['crashed: internal', 'reloading', 'ready'], `tab ${k}`);
      assert.deepEqual(answer, before[k].answer, `tab ${k}: the reloaded model gives the same greedy tokens`);
    }
    for (const t of tabs) await t.close();
  });
}
