// llama.cpp's own Q4_K_M of the default model (Q5_0, Q8_0, Q4_K and Q6_K tensors; Q, K and V of
// different types) in the browser: its greedy tokens equal llama.cpp's
// (tests/data/reference-q4_k_m) up to llama.cpp's first near-tie.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { CONTEXT_LENGTH, launch, openTestPage, ROOT, startServer } from './harness.mjs';

const MINUTES = 60_000;
const MODEL_URL = '/models/SmolLM2-135M-Instruct.Q4_K_M.gguf';
// A raw prompt whose reference has no near-tie (top-2 logit margin < 0.1) in its first steps.
const PROMPT_ID = 'pub_raw_json';
const STEPS = 6;
const NEAR_TIE = 0.1;

describe('K-quants in Chromium', { timeout: 30 * MINUTES }, () => {
  let server;
  let browser;

  before(async () => {
    server = await startServer();
    browser = await launch();
  });

  after(async () => {
    await browser?.close();
    await server?.close();
  });

  test("(g) llama.cpp's Q4_K_M streams llama.cpp's greedy tokens", { timeout: 25 * MINUTES }, async () => {
    const reference = JSON.parse(readFileSync(join(ROOT, 'tests/data/reference-q4_k_m/greedy.json'), 'utf8'));
    const prompts = JSON.parse(readFileSync(join(ROOT, 'tests/data/reference/prompts.json'), 'utf8'));
    const want = reference.prompts.find((p) => p.id === PROMPT_ID);
    const text = prompts.prompts.find((p) => p.id === PROMPT_ID).text;
    const nearTie = want.step_top1_top2_logit_margin.findIndex((m) => m < NEAR_TIE);
    assert.ok(nearTie === -1 || nearTie >= STEPS, `the reference has a near-tie at step ${nearTie}`);

    const page = await openTestPage(browser.context, server.url);
    page.setDefaultTimeout(20 * MINUTES);
    const out = await page.evaluate(async ({ modelUrl, prompt, steps, contextLength }) => {
      const engine = await window.kestrel.createEngine({ model: modelUrl, context_length: contextLength });
      const r = await engine.completions.create({ prompt, temperature: 0, max_tokens: steps, ignore_eos: true });
      await engine.unload();
      return r;
    }, { modelUrl: MODEL_URL, prompt: text, steps: STEPS, contextLength: CONTEXT_LENGTH });
    console.log(`Q4_K_M: ${JSON.stringify(out.choices[0].text)}; usage ${JSON.stringify(out.usage)}`);
    assert.deepEqual(out.kestrel.prompt_token_ids, want.prompt_ids);
    assert.deepEqual(out.kestrel.token_ids, want.greedy_ids.slice(0, STEPS));
    await page.close();
  });
});
