// Every WGSL variant the native tests compiled (naga, for lavapipe), compiled again by Chromium's
// WebGPU (Tint), which checks what naga does not, such as barriers only in uniform control flow.
// The native tests build variants this suite's SwiftShader adapter never picks (the sliced decode
// matvec of real GPUs): compiled here, an error in one shows before a real GPU does. The variants
// are the files `KESTREL_DUMP_WGSL` wrote (build.sh passes their folder as KESTREL_WGSL_DIR).
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';
import { MINUTES, openTestPage, serveAndLaunch } from './harness.mjs';

const DIR = process.env.KESTREL_WGSL_DIR;

describe('every shader variant compiles in Chromium', { timeout: 10 * MINUTES }, () => {
  const env = serveAndLaunch();
  let page;

  before(async () => {
    page = await openTestPage(env.browser.context, env.server.url);
  });

  test('the native tests\' WGSL variants pass Tint', async () => {
    assert.ok(DIR && existsSync(DIR), 'KESTREL_WGSL_DIR names no folder: run through ./build.sh test-browser, which writes the variants');
    const files = readdirSync(DIR).filter((f) => f.endsWith('.wgsl'));
    const sources = files.map((f) => [f, readFileSync(join(DIR, f), 'utf8')]);
    // Both matvec variants: one thread a row (software adapters) and sliced rows (GPUs).
    assert.ok(files.some((f) => /^matvec\..*SLICED=1/.test(f)), 'no sliced matvec variant among the files');
    assert.ok(files.some((f) => /^matvec\./.test(f) && !/SLICED=1/.test(f)), 'no one-thread-a-row matvec variant among the files');
    const failures = await page.evaluate(async (sources) => {
      const adapter = await navigator.gpu.requestAdapter();
      const wanted = ['subgroups', 'shader-f16'].filter((f) => adapter.features.has(f));
      const device = await adapter.requestDevice({ requiredFeatures: wanted });
      const out = [];
      for (const [name, code] of sources) {
        if (code.includes('enable subgroups') && !device.features.has('subgroups')) {
          out.push({ name, error: 'the adapter has no subgroups: this variant cannot be checked here' });
          continue;
        }
        device.pushErrorScope('validation');
        const module = device.createShaderModule({ code });
        const info = await module.getCompilationInfo();
        const error = await device.popErrorScope();
        const messages = info.messages.filter((m) => m.type === 'error').map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
        if (messages.length || error) out.push({ name, error: messages.join('; ') || error.message });
      }
      return out;
    }, sources);
    console.log(`${files.length} variants compiled by Tint, ${failures.length} failed`);
    for (const f of failures) console.log(`${f.name}: ${f.error}`);
    assert.ok(files.length >= 50, `only ${files.length} variants`);
    assert.deepEqual(failures, []);
  });
});
