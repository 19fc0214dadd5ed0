// The KV prefix kept across page reloads (createEngine's `persistPrefix`), on the tiny
// random-weight qwen3 model: after a reload, a follow-up prompt prefills only what follows the
// saved tokens and generates exactly what a fresh engine does; a corrupted snapshot is deleted and
// not used; the byte budget keeps the most recent snapshots; a snapshot a later one extends is
// dropped; one of another cache setup (an f32 cache) is neither used nor deleted; and
// clearSavedPrefixes() deletes them all, while a live engine goes on saving.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CONTEXT_LENGTH, MINUTES, openTestPage, serveAndLaunch } from './harness.mjs';

const env = serveAndLaunch();
const MODEL_URL = '/models/synthetic-qwen3-f32.gguf';
const FIRST = 'the kestrel hovers over the green field in the morning light and the wind lifts its wings '
  + 'above the river while a small bird sees it and dives quickly under the brown grass';
const GREEDY = { max_tokens: 6, temperature: 0 };

/** The snapshots in the page's Origin Private File System: [{name, bytes}]. */
function listSnapshots(page) {
  return page.evaluate(async () => {
    const root = await navigator.storage.getDirectory();
    const dir = await root.getDirectoryHandle('kestrel-kv-prefixes', { create: true });
    const files = [];
    for await (const [name, handle] of dir.entries()) files.push({ name, bytes: (await handle.getFile()).size });
    return files.sort((a, b) => a.name.localeCompare(b.name));
  });
}

/**
 * In a freshly loaded page: `prompt` on an engine with `persistPrefix`, then on a fresh engine
 * without it. `memory()` answers after the snapshot is saved.
 */
async function followUp(page, prompt) {
  await page.reload();
  await page.waitForFunction(() => window.kestrelReady === true);
  return page.evaluate(async ({ model, prompt, options, contextLength }) => {
    const { createEngine } = window.kestrel;
    const engine = await createEngine({ model, persistPrefix: true, context_length: contextLength });
    const kept = await engine.completions.create({ prompt, ...options });
    await engine.memory();
    await engine.unload();
    const fresh = await createEngine({ model, context_length: contextLength });
    const alone = await fresh.completions.create({ prompt, ...options });
    await fresh.unload();
    return { kept: { usage: kept.usage, ...kept.kestrel }, alone: { usage: alone.usage, ...alone.kestrel } };
  }, { model: MODEL_URL, prompt, options: GREEDY, contextLength: CONTEXT_LENGTH });
}

test('persistPrefix: a reload prefills only the new tokens; corrupt snapshots are dropped; the budget holds', { timeout: 15 * MINUTES }, async () => {
  const page = await openTestPage(env.browser.context, env.server.url);
  page.setDefaultTimeout(10 * MINUTES);

  const first = await page.evaluate(async ({ model, prompt, options, contextLength }) => {
    const engine = await window.kestrel.createEngine({ model, persistPrefix: true, context_length: contextLength });
    const r = await engine.completions.create({ prompt, ...options });
    // The snapshot is written after the answer: flush() waits for it, so a reload may follow.
    await engine.flush();
    window.firstEngine = engine;
    return { text: r.choices[0].text, persist: engine.info.persist_prefix, ...r.kestrel };
  }, { model: MODEL_URL, prompt: FIRST, options: GREEDY, contextLength: CONTEXT_LENGTH });
  assert.deepEqual(first.persist, { enabled: true, reason: null });
  // Listed while the engine is still loaded: flush() alone made the snapshot readable.
  const firstSaved = await listSnapshots(page);
  await page.evaluate(() => window.firstEngine.unload());
  assert.equal(firstSaved.length, 1, 'one snapshot after the first request');
  // The cache holds the prompt and every generated token but the last, which never ran.
  const saved = [...first.prompt_token_ids, ...first.token_ids.slice(0, -1)];

  // After a reload, the follow-up reuses the saved rows and changes nothing in the output.
  const second = `${FIRST}${first.text} and the falcon`;
  const r = await followUp(page, second);
  console.log('persistPrefix after a reload:', JSON.stringify(r.kept.usage), 'fresh:', JSON.stringify(r.alone.usage));
  const prompt = r.kept.prompt_token_ids;
  let shared = 0;
  while (shared < saved.length && saved[shared] === prompt[shared]) shared++;
  assert.ok(shared >= first.prompt_token_ids.length, `the follow-up shares ${shared} tokens with the snapshot`);
  assert.equal(r.kept.usage.extra.reused_tokens, Math.min(shared, prompt.length - 1));
  assert.equal(r.kept.usage.extra.prefill_tokens, prompt.length - r.kept.usage.extra.reused_tokens);
  assert.equal(r.alone.usage.extra.reused_tokens, 0);
  assert.deepEqual(r.kept.token_ids, r.alone.token_ids, 'the restored prefix changes nothing in the output');
  const secondSaved = await listSnapshots(page);
  assert.equal(secondSaved.length, 1, 'the second snapshot extends the first, which is dropped');
  assert.notEqual(secondSaved[0].name, firstSaved[0].name);

  // A snapshot with one byte changed is refused, deleted, and the request prefills everything.
  await page.evaluate(async (name) => {
    const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle('kestrel-kv-prefixes');
    const handle = await dir.getFileHandle(name);
    const bytes = new Uint8Array(await (await handle.getFile()).arrayBuffer());
    bytes[bytes.length >> 1] ^= 1;
    const writable = await handle.createWritable();
    await writable.write(bytes);
    await writable.close();
  }, secondSaved[0].name);
  const third = `${second} over the water`;
  const c = await followUp(page, third);
  assert.equal(c.kept.usage.extra.reused_tokens, 0, 'the corrupt snapshot was not used');
  assert.deepEqual(c.kept.token_ids, c.alone.token_ids);
  const afterCorrupt = await listSnapshots(page);
  assert.ok(!afterCorrupt.some((f) => f.name === secondSaved[0].name), 'the corrupt snapshot was deleted');
  assert.equal(afterCorrupt.length, 1, 'the new request saved its own');

  // A budget one byte over the saved snapshot: an unrelated, shorter conversation replaces it.
  const budget = afterCorrupt[0].bytes + 1;
  const other = 'sky wind mouse hunts the tail feathers slowly above the morning grass and the river light '
    + 'while the falcon sees the small bird dive under the brown field';
  await page.evaluate(async ({ model, prompt, options, contextLength, maxBytes }) => {
    const engine = await window.kestrel.createEngine({ model, persistPrefix: { maxBytes }, context_length: contextLength });
    await engine.completions.create({ prompt, ...options });
    await engine.memory();
    await engine.unload();
  }, { model: MODEL_URL, prompt: other, options: GREEDY, contextLength: CONTEXT_LENGTH, maxBytes: budget });
  const budgeted = await listSnapshots(page);
  assert.equal(budgeted.length, 1, `a ${budget}-byte budget holds one snapshot`);
  assert.notEqual(budgeted[0].name, afterCorrupt[0].name, 'the least recently written one went');

  // An engine with an f32 cache cannot use the f16 snapshot, and leaves it for the f16 setup.
  const mismatched = await page.evaluate(async ({ model, prompt, options, contextLength }) => {
    const engine = await window.kestrel.createEngine({ model, persistPrefix: true, kv_cache: 'f32', context_length: contextLength });
    const r = await engine.completions.create({ prompt, ...options });
    await engine.memory();
    window.f32Engine = engine;
    return r.usage.extra.reused_tokens;
  }, { model: MODEL_URL, prompt: other, options: GREEDY, contextLength: CONTEXT_LENGTH });
  assert.equal(mismatched, 0, 'an f16 snapshot was restored into an f32 cache');
  const both = await listSnapshots(page);
  assert.ok(both.some((f) => f.name === budgeted[0].name), 'the f16 snapshot was kept');
  assert.equal(both.length, 2, 'the f32 engine saved its own');
  assert.equal(await page.evaluate(() => window.kestrel.clearSavedPrefixes()), true);
  assert.deepEqual(await listSnapshots(page), []);
  // An engine alive through the clear goes on saving, into a new directory.
  await page.evaluate(async ({ prompt, options }) => {
    await window.f32Engine.completions.create({ prompt: `${prompt} again`, ...options });
    await window.f32Engine.memory();
    await window.f32Engine.unload();
  }, { prompt: other, options: GREEDY });
  assert.equal((await listSnapshots(page)).length, 1, 'the engine saved nothing after clearSavedPrefixes()');

  const bad = await page.evaluate(({ model }) => window.kestrel.createEngine({ model, persistPrefix: { maxBytes: -1 } }).then(() => null, (e) => e.code), { model: MODEL_URL });
  assert.equal(bad, 'invalid_option');
  // The CPU backend keeps no snapshots, and says so in engine.info instead of staying silent.
  const beforeCpu = await listSnapshots(page);
  const cpu = await page.evaluate(async ({ model, prompt, options, contextLength }) => {
    const engine = await window.kestrel.createEngine({ model, backend: 'cpu', persistPrefix: true, context_length: contextLength });
    await engine.completions.create({ prompt, ...options });
    await engine.flush();
    const persist = engine.info.persist_prefix;
    await engine.unload();
    const plain = await window.kestrel.createEngine({ model, backend: 'cpu', context_length: contextLength });
    const none = plain.info.persist_prefix;
    await plain.unload();
    return { persist, none };
  }, { model: MODEL_URL, prompt: other, options: GREEDY, contextLength: CONTEXT_LENGTH });
  assert.equal(cpu.persist.enabled, false);
  assert.match(cpu.persist.reason, /CPU backend/);
  assert.equal(cpu.none, null, 'without persistPrefix, persist_prefix is null');
  assert.deepEqual(await listSnapshots(page), beforeCpu, 'the CPU engine saved nothing');
  await page.close();
});
