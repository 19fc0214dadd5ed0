// The browser half of the suite: www/bench/ in headless Chromium through playwright-core, with
// WebGPU on whatever adapter Chromium picks (SwiftShader on a machine without a GPU), served by
// the package's own static server (www/serve.mjs: COOP/COEP, so wasm threads work).
import { copyFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { chromium } from 'playwright-core';
import { launchChromium } from '../www/chromium.mjs';
import { startServer } from '../www/serve.mjs';
import { ROOT } from './paths.mjs';
import { spread } from './stats.mjs';

/** Copies wllama's bundle and wasm where the static server serves them (www/bench/vendor/, git-ignored). */
function vendorWllama() {
  const require = createRequire(import.meta.url);
  const esm = dirname(require.resolve('@wllama/wllama'));
  const out = join(ROOT, 'www/bench/vendor/wllama');
  mkdirSync(out, { recursive: true });
  copyFileSync(join(esm, 'index.js'), join(out, 'index.js'));
  copyFileSync(join(esm, 'wasm/wllama.wasm'), join(out, 'wllama.wasm'));
  const { version } = require('@wllama/wllama/package.json');
  return version;
}

/**
 * Runs the browser workload: Kestrel, wllama on CPU threads, wllama on WebGPU (or why it cannot),
 * then, unless `batch` is null, Kestrel's batching ('auto' backend): `batch.sizes` concurrent
 * requests of `batch.decodeTokens` steps each. `prompts`: [{prompt_tokens, text}]. Resolves to
 * {browser, adapter, wllama_version, engines, batch}.
 */
export async function runBrowser({ modelUrl, prompts, decodeTokens, repeats, threads, contextLength, realGpu = false, only = null, batch = null, constrained = null, embeddings = null }) {
  const wllamaVersion = vendorWllama();
  return withBenchPages(realGpu, async (open, context) => {
    const workload = { modelUrl, prompts, decodeTokens, repeats };
    const page = await open();
    const adapter = await page.evaluate(() => window.bench.adapterInfo());
    const isolated = await page.evaluate(() => crossOriginIsolated);
    await page.close();
    const runs = [
      ['kestrel', (p) => p.evaluate((w) => window.bench.runKestrel(w), { ...workload, backend: 'webgpu' })],
      ['kestrel-cpu', (p) => p.evaluate((w) => window.bench.runKestrel(w), { ...workload, backend: 'cpu' })],
      ['wllama-cpu', (p) => p.evaluate((w) => window.bench.runWllama(w), { ...workload, threads, contextLength, gpuLayers: 0 })],
      ['wllama-webgpu', (p) => p.evaluate((w) => window.bench.runWllama(w), { ...workload, threads, contextLength, gpuLayers: 999 })],
    ];
    const engines = [];
    for (const [name, run] of runs) {
      if (only && !only.includes(name)) continue;
      console.error(`browser: ${name}`);
      // A fresh page per engine, so that each one's memory is its own.
      const p = await open();
      try {
        engines.push({ name, ...(await run(p)) });
      } catch (e) {
        engines.push({ name, error: String(e.message ?? e).split('\n')[0] });
        console.error(`  ${name} failed: ${e.message}`);
      } finally {
        await p.close();
      }
    }
    let batched = null;
    if (batch) {
      console.error('browser: kestrel-batch');
      const p = await open();
      try {
        const r = await p.evaluate((w) => window.bench.runKestrelBatch(w), {
          modelUrl, prompts, repeats, decodeTokens: batch.decodeTokens, batchSizes: batch.sizes, backend: 'auto',
        });
        const one = spread(r.batches.find((b) => b.batch === 1)?.decode_tok_s ?? []);
        batched = {
          ...r,
          rows: r.batches.map((b) => {
            const rate = spread(b.decode_tok_s);
            return { batch: b.batch, decode_tok_s: rate, ratio_to_batch_1: one ? rate.median / one.median : null };
          }),
        };
      } catch (e) {
        batched = { error: String(e.message ?? e).split('\n')[0] };
        console.error(`  kestrel-batch failed: ${e.message}`);
      } finally {
        await p.close();
      }
    }
    // Structured output on the CPU backend (wasm), and on WebGPU where it is a real GPU (on
    // SwiftShader a whole constrained answer takes minutes).
    const held = [];
    for (const backend of constrained ? (realGpu ? ['cpu', 'webgpu'] : ['cpu']) : []) {
      console.error(`browser: kestrel-${backend} constrained`);
      const p = await open();
      try {
        const r = await p.evaluate((w) => window.bench.runKestrelConstrained(w), { modelUrl, repeats, backend, ...constrained });
        const [c, f] = [spread(r.constrained_tok_s), spread(r.free_tok_s)];
        held.push({ ...r, constrained_tok_s: c, free_tok_s: f, ratio: c && f ? c.median / f.median : null });
      } catch (e) {
        held.push({ backend, error: String(e.message ?? e).split('\n')[0] });
        console.error(`  kestrel-${backend} constrained failed: ${e.message}`);
      } finally {
        await p.close();
      }
    }
    // An embedding model on the CPU backend (where every embedding model runs), on the native
    // bench's inputs.
    let embedded = null;
    if (embeddings) {
      console.error('browser: kestrel embeddings');
      const p = await open();
      try {
        const r = await p.evaluate((w) => window.bench.runKestrelEmbeddings(w), embeddings);
        embedded = { ...r, sentences_per_s: spread(r.sentences_per_s) };
      } catch (e) {
        embedded = { error: String(e.message ?? e).split('\n')[0] };
        console.error(`  kestrel embeddings failed: ${e.message}`);
      } finally {
        await p.close();
      }
    }
    return {
      embeddings: embedded,
      browser: chromiumVersion(context), cross_origin_isolated: isolated, adapter, wllama_version: wllamaVersion, engines, batch: batched,
      constrained: constrained ? held : null,
    };
  });
}

/**
 * Runs `fn(open, context)` with the static server and Chromium up (on the machine's GPU where
 * `realGpu`, else SwiftShader), closing both after; `open()` resolves to a fresh www/bench/ page
 * whose console goes to stderr.
 * @template T
 * @param {boolean} realGpu
 * @param {(open: () => Promise<import('playwright-core').Page>, context: import('playwright-core').BrowserContext) => Promise<T>} fn
 * @returns {Promise<T>}
 */
async function withBenchPages(realGpu, fn) {
  const server = await startServer();
  const launched = await launchChromium(chromium, {
    // measureUserAgentSpecificMemory() then answers at once instead of at the next garbage
    // collection.
    webgpu: realGpu ? 'gpu' : 'swiftshader',
    flags: ['--enable-blink-features=ForceEagerMeasureMemory'],
  });
  const { context } = launched;
  try {
    const open = async () => {
      const page = await context.newPage();
      page.on('console', (m) => console.error(`  [browser] ${m.text()}`));
      page.on('pageerror', (e) => console.error(`  [page error] ${e.message}`));
      await page.goto(`${server.url}/www/bench/`);
      await page.waitForFunction(() => window.benchReady === true);
      return page;
    };
    return await fn(open, context);
  } finally {
    await launched.close();
    await server.close();
  }
}

const chromiumVersion = (context) => `Chromium ${context.browser()?.version() ?? ''}`.trim();

/**
 * Speculative decoding in the page, the twin of `kestrel bench model --lookup`: Kestrel's wasm
 * CPU backend with prompt lookup, each workload's chat prompts (`workloads`: {name: [text]})
 * plain and with lookup alternately (www/bench/bench.js's runKestrelSpeculative). Resolves to the
 * page's runs and, per workload, the medians and ranges over the pairs where both runs decoded
 * (an answer of one token has no decode rate), lookup's acceptance and tokens per verifying step
 * over all its runs, and whether every lookup answer was the plain one.
 */
export async function runBrowserSpeculative({ modelUrl, workloads, maxTokens, maxDraft, repeats }) {
  return withBenchPages(false, async (open, context) => {
    const page = await open();
    try {
      const r = await page.evaluate((w) => window.bench.runKestrelSpeculative(w), { modelUrl, workloads, maxTokens, maxDraft, repeats });
      return {
        ...r,
        browser: chromiumVersion(context),
        workloads: r.workloads.map((w) => {
          const timed = w.pairs.filter((p) => p.plain.decode_tok_s != null && p.lookup.decode_tok_s != null);
          const sum = (key) => w.pairs.reduce((n, p) => n + p.lookup.speculative[key], 0);
          const [drafted, accepted, verifications] = [sum('drafted'), sum('accepted'), sum('verifications')];
          return {
            ...w,
            plain_decode_tok_s: spread(timed.map((p) => p.plain.decode_tok_s)),
            lookup_decode_tok_s: spread(timed.map((p) => p.lookup.decode_tok_s)),
            ratio: spread(timed.map((p) => p.lookup.decode_tok_s / p.plain.decode_tok_s)),
            drafted, accepted, verifications,
            acceptance: drafted > 0 ? accepted / drafted : null,
            // As the native bench counts it: the kept drafts plus each verifying step's own token.
            tokens_per_step: verifications > 0 ? (accepted + verifications) / verifications : null,
            same_text: w.pairs.every((p) => p.same_text),
            same_tokens: w.pairs.every((p) => p.same_tokens),
          };
        }),
      };
    } finally {
      await page.close();
    }
  });
}
