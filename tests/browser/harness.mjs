// Shared set-up of the browser tests: the static server, headless Chromium with WebGPU through
// SwiftShader, and the native CLI's greedy output to compare with.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before } from 'node:test';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { launchChromium } from '../../www/chromium.mjs';
import { startServer } from '../../www/serve.mjs';

export const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
export const MODEL_URL = '/models/SmolLM2-135M-Instruct.Q4_1.gguf';
/**
 * The random-weight Qwen3 (f32, 4 layers of 256) the native tests write and `./build.sh` copies
 * into models/: for the WebGPU tests of the engine's logic, where SwiftShader would spend minutes
 * on the default model's 30 layers.
 */
export const SMALL_MODEL_URL = '/models/synthetic-qwen3-f32.gguf';
export const ARTIFACTS = join(ROOT, 'tests/artifacts');
/**
 * KV cache size of the engines the tests create. SwiftShader's per-step cost grows with the
 * cache's size, and no test needs more than a few hundred positions.
 */
export const CONTEXT_LENGTH = 512;

/** Launches Chromium with a fresh profile; `webgpu: false` leaves WebGPU off. */
export function launch({ webgpu = true } = {}) {
  return launchChromium(chromium, { webgpu: webgpu ? 'swiftshader' : null });
}

export const MINUTES = 60_000;

/**
 * The browser suite's build of the wasm, with kestrel-wasm's test hooks (`trapForTest`), which
 * `./build.sh` writes beside the package's (build_test_wasm): $KESTREL_TEST_WASM_PKG, else its
 * default place.
 */
export function testWasmPkg() {
  const pkg = process.env.KESTREL_TEST_WASM_PKG ?? join(ROOT, 'target/wasm-test-hooks/pkg');
  if (!existsSync(join(pkg, 'kestrel_wasm_bg.wasm'))) {
    throw new Error(`${pkg} is missing: \`./build.sh test-browser\` builds it (build_test_wasm), or set KESTREL_TEST_WASM_PKG`);
  }
  return pkg;
}

/**
 * Starts the static server and Chromium before a suite's tests and closes both after them.
 * Returns `{ server, browser }`, filled in once the suite's first `before` has run. With
 * `testHooks`, the server serves the wasm built with test hooks (`testWasmPkg`) as www/pkg.
 */
export function serveAndLaunch({ testHooks = false } = {}) {
  const env = { server: null, browser: null };
  before(async () => {
    env.server = await startServer(testHooks ? { pkg: testWasmPkg() } : {});
    env.browser = await launch();
  });
  after(async () => {
    await env.browser?.close();
    await env.server?.close();
  });
  return env;
}

/**
 * Opens the test page (which exposes the package as window.kestrel); forwards console errors.
 * `noSharedWorker` takes SharedWorker away before the package runs (the shared engine's path of
 * Chrome on Android).
 */
export async function openTestPage(context, baseUrl, { noSharedWorker = false } = {}) {
  const page = await context.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') console.log(`[browser ${m.type()}] ${m.text()}`);
  });
  page.on('pageerror', (e) => console.log(`[page error] ${e.message}`));
  if (noSharedWorker) {
    await page.addInitScript(() => {
      delete window.SharedWorker;
    });
  }
  await page.goto(`${baseUrl}/tests/browser/page.html`);
  await page.waitForFunction(() => window.kestrelReady === true);
  return page;
}

/** The native CLI: $KESTREL_CLI, else the dev build. */
export function cliPath() {
  // build.sh builds the CLI in the dev profile, which shares its compiled dependencies with
  // `cargo test` (a release build would compile everything a second time).
  const cli = process.env.KESTREL_CLI ?? join(ROOT, 'target/debug/kestrel');
  if (!existsSync(cli)) throw new Error(`${cli} is missing: build it with \`cargo build -p kestrel-cli\` or set KESTREL_CLI`);
  return cli;
}

/**
 * The native CLI's greedy generation for a chat prompt on `backend` ('gpu': the kernels the
 * browser's WebGPU path runs; 'cpu'): {prompt_token_ids, token_ids, text}.
 */
export function nativeGreedy(prompt, maxTokens, backend = 'gpu') {
  const cli = cliPath();
  const out = execFileSync(cli, ['generate', '--backend', backend, '--json', '--temperature', '0', '--max-tokens', String(maxTokens), prompt], {
    cwd: ROOT,
    env: { XDG_RUNTIME_DIR: '/tmp', ...process.env },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return JSON.parse(out);
}

/**
 * Starts `kestrel serve` (the default model) on a free port with `args`; resolves to
 * `{ url, close }` once it listens (`url` is the API's base, ending in /v1).
 */
export function startKestrelServe(args = []) {
  const child = spawn(cliPath(), ['serve', '--port', '0', '--context', String(CONTEXT_LENGTH), ...args], {
    cwd: ROOT,
    env: { XDG_RUNTIME_DIR: '/tmp', ...process.env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  return new Promise((resolveStart, reject) => {
    let seen = '';
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (text) => {
      seen += text;
      const found = seen.match(/listening on (http:\/\/\S+) /);
      if (found) {
        seen = '';
        const close = () => new Promise((done) => { child.once('exit', done); child.kill('SIGTERM'); });
        resolveStart({ url: `${found[1]}/v1`, close });
      }
    });
    child.once('exit', (code) => reject(new Error(`kestrel serve exited with ${code} before listening: ${seen}`)));
  });
}

/**
 * Resident memory of `browser`'s GPU process in bytes, read from /proc (Linux): where WebGPU's
 * buffers live when SwiftShader runs them, so GPU memory nobody frees shows up here.
 */
export function gpuProcessBytes(browser) {
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let command;
    try {
      // Chromium rewrites its command line into one space-separated string.
      command = ` ${readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ')} `;
    } catch {
      continue; // the process ended while listing
    }
    if (command.includes(' --type=gpu-process ') && command.includes(` --user-data-dir=${browser.userDataDir} `)) {
      const kib = readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB$/m);
      if (kib) return Number(kib[1]) * 1024;
    }
  }
  throw new Error(`no GPU process of the browser with profile ${browser.userDataDir}`);
}

/**
 * On the test `page`: each of `requests` (completions) alone, one at a time on an engine without
 * slots, then all of them at once on an engine with `slots`, streamed, together with `aborted`,
 * a long request aborted after its second chunk. Both engines on `backend` with `contextLength`,
 * loading `model` (a URL; the default model unless given).
 * Resolves to `{ alone: [{ids, text}], together: [{ids, text, finish}]` (`aborted`'s last),
 * `order` (the request of each streamed token chunk, in arrival order), `info` (the batched
 * engine's) `}`.
 */
export function runBatchedAndAlone(page, { backend, contextLength, slots, requests, aborted, model = MODEL_URL }) {
  return page.evaluate(async ({ model, backend, contextLength, slots, requests, aborted }) => {
    const { createEngine } = window.kestrel;
    const single = await createEngine({ model, backend, context_length: contextLength });
    const alone = [];
    for (const q of requests) {
      const out = await single.completions.create(q);
      alone.push({ ids: out.kestrel.token_ids, text: out.choices[0].text });
    }
    await single.unload();

    const engine = await createEngine({ model, backend, context_length: contextLength, slots });
    const order = [];
    const run = async (q, i, abortAfter) => {
      const controller = new AbortController();
      const chunks = [];
      for await (const c of await engine.completions.create({ ...q, stream: true, signal: controller.signal })) {
        chunks.push(c);
        if (c.choices[0]?.text != null && c.choices[0].finish_reason == null) order.push(i);
        if (abortAfter && chunks.length === abortAfter) controller.abort();
      }
      const last = chunks[chunks.length - 1];
      return { text: chunks.map((c) => c.choices[0]?.text ?? '').join(''), ids: last.kestrel.token_ids, finish: last.choices[0]?.finish_reason };
    };
    const together = await Promise.all([...requests.map((q, i) => run(q, i)), run(aborted, requests.length, 2)]);
    const info = engine.info;
    await engine.unload();
    return { alone, together, order, info };
  }, { model, backend, contextLength, slots, requests, aborted });
}

/**
 * What `runBatchedAndAlone` must show: each request's tokens and text batched as alone, run to
 * its length; the aborted one stopped early; the streams interleaved (each request's first token
 * before the previous one's last), so they did run together.
 */
export function assertBatchedAsAlone(r, requests, aborted) {
  requests.forEach((q, i) => {
    assert.deepEqual(r.together[i].ids, r.alone[i].ids, `request ${i}: batched tokens differ from alone`);
    assert.equal(r.together[i].text, r.alone[i].text);
    assert.equal(r.together[i].finish, 'length');
  });
  const stopped = r.together[requests.length];
  assert.equal(stopped.finish, 'abort');
  assert.ok(stopped.ids.length < aborted.max_tokens, 'the aborted request stopped');
  for (let i = 1; i < requests.length; i++) {
    assert.ok(r.order.indexOf(i) < r.order.lastIndexOf(i - 1), `streams ran one after another: ${r.order.join('')}`);
  }
}
