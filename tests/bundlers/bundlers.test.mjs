// The npm package as a new user gets it, from the tarball `npm pack ./www` makes, in a small app
// (index.html, main.js) built for production with Vite 5-8 and webpack 5, and served by the dev
// servers of Vite 5-8, each opened in headless Chromium (WebGPU on SwiftShader): tokens stream,
// each subpath export (ai-sdk, prompt-api, langchain, with the real `ai` and `@langchain/core`)
// and a shared engine give the package's own greedy answer, and the app asks nothing of another
// origin; `vite preview` serves a build and its model gzipped on the fly, and the shared engine
// loads it; and the README's quick start, copied as a user would, streams tokens. The dev servers of Vite 5-7 pre-bundle the package
// into node_modules/.vite/deps/, away from the worker that `new URL('./worker.js', import.meta.url)`
// names: without `optimizeDeps.exclude` the engine fails with an error that says so, with it
// tokens stream. Needs www/pkg (`./build.sh wasm`) and models/synthetic-qwen3-f32.gguf.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { MINUTES, ROOT, serveAndLaunch } from '../browser/harness.mjs';

const HERE = fileURLToPath(new URL('.', import.meta.url));
// What main.js loads (a cached copy where its origin loaded it before).
const MODEL_PATH = '/models/synthetic-qwen3-f32.gguf';
const MAX_TOKENS = 2; // main.js's request
const VITES = ['vite5', 'vite6', 'vite7', 'vite8'];
// Vite 8 pre-bundles with Rolldown, which keeps the package's worker beside it.
const VITES_NEEDING_EXCLUDE = ['vite5', 'vite6', 'vite7'];
const FIX = "optimizeDeps: { exclude: ['@kestrel-llm/web'] }";

const env = serveAndLaunch();

/** Runs `node args` in this folder; its output is in the error when it fails. */
function node(args) {
  return execFileSync(process.execPath, args, { cwd: HERE, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

before(() => {
  for (const file of ['www/pkg/kestrel_wasm_bg.wasm', MODEL_PATH.slice(1)]) {
    if (!existsSync(join(ROOT, file))) throw new Error(`${file} is missing: ./build.sh test-bundlers makes it`);
  }
  // A fresh folder each run: npm reinstalls a tarball whose path it has not installed before.
  const dir = mkdtempSync(join(tmpdir(), 'kestrel-pack-'));
  try {
    const [{ filename }] = JSON.parse(execFileSync('npm', ['pack', './www', '--pack-destination', dir, '--json'], { cwd: ROOT, encoding: 'utf8' }));
    // The locked bundlers, and the package from its tarball without recording it (package.json
    // and package-lock.json stay as committed).
    execFileSync('npm', ['install', '--no-save', '--no-audit', '--no-fund', join(dir, filename)], { cwd: HERE, stdio: ['ignore', 'ignore', 'inherit'] });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/**
 * Opens the app at `url` in the shared Chromium and waits for main.js's outcome. Resolves to
 * `{ outcome, requests }`: `requests` lists every URL the page and its worker asked for.
 */
async function openApp(url) {
  const page = await env.browser.context.newPage();
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));
  page.on('console', (m) => {
    if (m.type() === 'error') console.log(`[browser error] ${m.text()} ${m.location().url}`);
  });
  page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
  try {
    await page.goto(url);
    await page.waitForFunction(() => window.kestrelOutcome, null, { timeout: 3 * MINUTES });
    return { outcome: await page.evaluate(() => window.kestrelOutcome), requests };
  } finally {
    await page.close();
  }
}

/**
 * The app streamed its tokens and a final usage; each integration and the shared engine (run by
 * the SharedWorker the bundler built) answered the package's own greedy chat answer; and the app
 * asked for nothing outside `url`'s origin.
 */
function assertStreamed({ outcome, requests }, url) {
  assert.equal(outcome.ok, true, `the app failed: ${outcome.code}: ${outcome.message}`);
  assert.equal(outcome.chunks.filter((c) => Number.isInteger(c.token_id)).length, MAX_TOKENS, JSON.stringify(outcome.chunks));
  assert.equal(outcome.usage?.completion_tokens, MAX_TOKENS, JSON.stringify(outcome.usage));
  console.log(`${url}: the package's greedy chat answer ${JSON.stringify(outcome.chat)}; integrations ${JSON.stringify(outcome.integrations)}; shared ${JSON.stringify(outcome.shared)}`);
  assert.ok(outcome.chat.tokens >= 1, JSON.stringify(outcome.chat));
  for (const [integration, text] of Object.entries(outcome.integrations)) {
    assert.equal(text, outcome.chat.text, `${integration} through the bundled subpath export`);
  }
  assert.deepEqual(outcome.shared, { ...outcome.chat, mode: 'shared-worker' }, 'the shared engine');
  // The engine's worker fetches the wasm: seeing it shows that the worker's requests are among
  // those the origin check reads.
  assert.ok(requests.some((r) => new URL(r).pathname.endsWith('.wasm')), `no request for the engine's wasm among ${requests.join(' ')}`);
  const origin = new URL(url).origin;
  const foreign = requests.filter((r) => new URL(r).origin !== origin);
  assert.deepEqual(foreign, [], `requests to another origin than ${origin}`);
}

/** Opens the production build in dist/NAME, served with the models by the static server. */
async function assertBuildStreams(name) {
  const url = `${env.server.url}/tests/bundlers/dist/${name}/index.html`;
  assertStreamed(await openApp(url), url);
}

for (const vite of VITES) {
  test(`${vite}: a production build streams tokens`, { timeout: 4 * MINUTES }, async () => {
    node([`node_modules/${vite}/bin/vite.js`, 'build', '--outDir', `dist/${vite}`, '--emptyOutDir']);
    await assertBuildStreams(vite);
  });
}

test('webpack 5: a production build streams tokens', { timeout: 4 * MINUTES }, async () => {
  node(['node_modules/webpack-cli/bin/cli.js', '--config', 'webpack.config.mjs']);
  await assertBuildStreams('webpack');
});

/**
 * A free port no dev server of this run had: each gets its own origin, so that none finds what
 * another left in the browser's caches (Vite serves pre-bundled files as immutable).
 */
const usedPorts = new Set();
async function freshPort() {
  for (;;) {
    const probe = createServer();
    await new Promise((listening) => probe.listen(0, '127.0.0.1', listening));
    const { port } = probe.address();
    await new Promise((closed) => probe.close(closed));
    if (!usedPorts.has(port)) {
      usedPorts.add(port);
      return port;
    }
  }
}

/** How long a dev server may take to print its URL (it starts in about a second here). */
const DEV_SERVER_START_S = 60;
/** Terminal colour and style escapes (CSI sequences). */
const ANSI_ESCAPE = /\x1b\[[0-9;]*m/g;

/**
 * Starts `vite`'s dev server with `config`, re-optimizing its dependencies (the Vite versions share
 * its cache folder); /models/ goes to the static server. Resolves to `{ url, close }`.
 */
async function startDevServer(vite, config) {
  return startVite(vite, ['--config', config, '--force'], { KESTREL_MODELS_ORIGIN: env.server.url });
}

/**
 * Starts `vite` with `args` (a command and its options) on a fresh port, with `extraEnv`; resolves
 * to `{ url, close }` once it prints its URL.
 */
async function startVite(vite, args, extraEnv = {}) {
  const port = String(await freshPort());
  const child = spawn(process.execPath, [`node_modules/${vite}/bin/vite.js`, ...args, '--host', '127.0.0.1', '--port', port, '--strictPort'], {
    cwd: HERE,
    // Vite colours its banner wherever `CI` is set (picocolors), even into a pipe: NO_COLOR keeps
    // the URL plain, and the escapes are stripped anyway should a version ignore it.
    env: { ...process.env, ...extraEnv, NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const close = () => new Promise((done) => {
    if (child.exitCode !== null) return done();
    child.once('exit', done);
    child.kill('SIGTERM');
  });
  let output = '';
  return new Promise((resolveStart, reject) => {
    const gaveUp = setTimeout(() => {
      close();
      reject(new Error(`${vite} ${args[0]} named no URL within ${DEV_SERVER_START_S} s: ${output}`));
    }, DEV_SERVER_START_S * 1000);
    const read = (text) => {
      output += text;
      const found = output.replace(ANSI_ESCAPE, '').match(/Local:\s+(http:\/\/\S+)/);
      if (found) {
        clearTimeout(gaveUp);
        resolveStart({ url: found[1], close });
      }
    };
    child.stdout.setEncoding('utf8').on('data', read);
    child.stderr.setEncoding('utf8').on('data', read);
    child.once('exit', (code) => {
      clearTimeout(gaveUp);
      reject(new Error(`${vite} ${args[0]} exited with ${code} before listening: ${output}`));
    });
  });
}

/** Opens the app on `vite`'s dev server with `config`; resolves to openApp's answer. */
async function openOnDevServer(vite, config) {
  const server = await startDevServer(vite, config);
  try {
    return { ...(await openApp(server.url)), url: server.url };
  } finally {
    await server.close();
  }
}

for (const vite of VITES) {
  if (VITES_NEEDING_EXCLUDE.includes(vite)) {
    test(`${vite}: the dev server without optimizeDeps.exclude fails with an error that names the fix`, { timeout: 4 * MINUTES }, async () => {
      const { outcome } = await openOnDevServer(vite, 'vite.config.mjs');
      assert.equal(outcome.ok, false, 'tokens streamed: drop the exclude from the README and this test');
      assert.equal(outcome.code, 'worker_error', outcome.message);
      assert.ok(outcome.message.includes(FIX), outcome.message);
    });
  }
  const config = VITES_NEEDING_EXCLUDE.includes(vite) ? 'vite.exclude.config.mjs' : 'vite.config.mjs';
  test(`${vite}: the dev server with ${config} streams tokens`, { timeout: 4 * MINUTES }, async () => {
    const { url, ...result } = await openOnDevServer(vite, config);
    assertStreamed(result, url);
    // A fresh origin: the model came through the dev server.
    assert.ok(result.requests.some((r) => new URL(r).pathname === MODEL_PATH), 'the model was not fetched from the dev server');
  });
}

// `vite preview` serves the production build and the model from it, compressing the model on the
// fly (Content-Encoding: gzip, a weak ETag, no Content-Length): the shared engine failed there
// for a new user with "GGUF file truncated" where the unshared one loaded.
test('vite8: `vite preview` serves the build and its model compressed on the fly, and the shared engine loads it', { timeout: 4 * MINUTES }, async () => {
  const out = 'dist/vite8-preview';
  node(['node_modules/vite8/bin/vite.js', 'build', '--outDir', out, '--emptyOutDir']);
  mkdirSync(join(HERE, out, 'models'), { recursive: true });
  copyFileSync(join(ROOT, MODEL_PATH.slice(1)), join(HERE, out, MODEL_PATH.slice(1)));
  // Without KESTREL_MODELS_ORIGIN: vite preview serves the model itself, from the build.
  const server = await startVite('vite8', ['preview', '--outDir', out]);
  try {
    const url = `${server.url.replace(/\/$/, '')}/`;
    const answer = await fetch(new URL(MODEL_PATH, url), { headers: { 'Accept-Encoding': 'gzip' } });
    await answer.body?.cancel();
    assert.equal(answer.headers.get('content-encoding'), 'gzip', 'vite preview compresses the model: the case under test');
    assertStreamed(await openApp(url), url);
  } finally {
    await server.close();
  }
});

/**
 * The README's quick start as a user copies it: its JavaScript block, with the model URL pointed at
 * the default model on this origin (the hub is out of reach here), is an app's module script,
 * built by Vite 8 against the packed tarball and run in Chromium. Resolves to the app's folder.
 */
function writeQuickStartApp() {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const start = readme.indexOf('## Quick start');
  const code = readme.slice(start).match(/```js\n([\s\S]*?)```/)?.[1];
  assert.ok(start >= 0 && code, 'the README has a quick start with a js block');
  const model = /model: '[^']*'/;
  assert.match(code, model, 'the quick start names its model');
  const dir = join(HERE, 'quickstart');
  mkdirSync(dir, { recursive: true });
  const local = code.replace(model, "model: '/models/SmolLM2-135M-Instruct.Q4_1.gguf'");
  // The snippet as it is, then what it streamed into the page, for openApp; its error (a module's
  // top-level rejection reaches the window) the same way.
  writeFileSync(join(dir, 'main.js'), `${local}\nwindow.kestrelOutcome = { ok: true, text: document.body.textContent };\n`);
  const onError = "<script>addEventListener('error', (e) => { window.kestrelOutcome = { ok: false, code: e.error?.code, message: e.message }; });</script>";
  writeFileSync(join(dir, 'index.html'), `<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>Quick start</title>${onError}</head><body><script type="module" src="./main.js"></script></body></html>\n`);
  return dir;
}

test("vite8: the README's quick start, as written, streams tokens from the packed package", { timeout: 4 * MINUTES }, async () => {
  writeQuickStartApp();
  node(['node_modules/vite8/bin/vite.js', 'build', 'quickstart', '--config', 'vite.config.mjs', '--outDir', '../dist/quickstart', '--emptyOutDir']);
  const url = `${env.server.url}/tests/bundlers/dist/quickstart/index.html`;
  const { outcome } = await openApp(url);
  assert.equal(outcome.ok, true, `the quick start failed: ${outcome.code}: ${outcome.message}`);
  console.log(`the quick start streamed: ${JSON.stringify(outcome.text)}`);
  assert.ok(outcome.text.trim().length > 0, 'no tokens streamed into the page');
});
