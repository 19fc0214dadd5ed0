// The provider's declarations (www/ai-sdk.d.ts) under each `ai` it supports: TypeScript, strict
// and checking every declaration file, compiles types/aiN.ts against ai 5, 6 and 7 (each
// tsconfig.aiN.json sends `ai` to one of this folder's three), where the model must be that
// version's LanguageModel (V2, V3, V4; not `any`) and go to generateText, streamText and
// createProviderRegistry as the SDK's own types say.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'node:test';

const TSC = join(import.meta.dirname, 'node_modules/.bin/tsc');

for (const major of [5, 6, 7]) {
  test(`the provider's types under ai ${major}`, () => {
    const run = spawnSync(TSC, ['-p', join(import.meta.dirname, `types/tsconfig.ai${major}.json`)], { encoding: 'utf8' });
    assert.equal(run.status, 0, `tsc -p types/tsconfig.ai${major}.json:\n${run.stdout}${run.stderr}`);
  });
}
