// The reader package.test.mjs trusts to list what each shipped module loads: every form the
// package uses is found, comments and strings are not, and what it cannot follow fails.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { moduleReferences, resolveReference } from './module-references.mjs';

const specifiers = (source, path = 'm.js') => moduleReferences(source, path).map((r) => `${r.kind}:${r.specifier}`);

test('finds static imports, re-exports, literal import() and new URL(…, import.meta.url)', () => {
  const source = `
    import init, { Engine } from './pkg/kestrel_wasm.js';
    import './side-effect.js';
    export { KestrelError } from './errors.js';
    export * from "./types.js";
    const lazy = () => import('./lazy.js');
    const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
    const wasm = new URL( "kestrel_wasm_bg.wasm" ,
      import.meta.url);
  `;
  assert.deepEqual(specifiers(source), [
    'import:./pkg/kestrel_wasm.js', 'import:./side-effect.js', 'import:./errors.js', 'import:./types.js',
    'import:./lazy.js', 'url:./worker.js', 'url:kestrel_wasm_bg.wasm',
  ]);
});

test('ignores what only looks like a reference: comments, strings, other uses of import.meta', () => {
  const source = `
    // import { a } from './commented.js';
    /* new URL('./in-a-block-comment.js', import.meta.url) */
    const text = "import('./in-a-string.js')";
    const onViteDeps = import.meta.url.includes('/.vite/deps/');
    const here = new URL('.', location.href);
  `;
  assert.deepEqual(specifiers(source), []);
});

test('reads type-only imports of declaration files', () => {
  const source = `
    import type { Estimate } from './estimate';
    export declare function estimate(options: { model: string }): Promise<Estimate>;
    export type { Chunk } from './chunk.js';
  `;
  assert.deepEqual(specifiers(source, 'index.d.ts'), ['import:./estimate', 'import:./chunk.js']);
});

test('fails on a reference it cannot follow instead of passing it by', () => {
  assert.throws(() => moduleReferences('const m = await import(`./locale/${lang}.js`);', 'm.js'), /import\(\) of an expression/);
  assert.throws(() => moduleReferences("const m = await import('./a' + '.js');", 'm.js'), /import\(\) of an expression/);
  assert.throws(() => moduleReferences('const u = new URL(file, import.meta.url);', 'm.js'), /new URL/);
});

test('resolves references inside the package, to dependencies, or outside it', () => {
  assert.deepEqual(resolveReference('worker.js', { specifier: './pkg/kestrel_wasm.js', kind: 'import' }), { file: 'pkg/kestrel_wasm.js' });
  assert.deepEqual(resolveReference('pkg/kestrel_wasm.js', { specifier: 'kestrel_wasm_bg.wasm', kind: 'url' }), { file: 'pkg/kestrel_wasm_bg.wasm' });
  assert.deepEqual(resolveReference('pkg/glue.js', { specifier: '../storage.js?v=1', kind: 'import' }), { file: 'storage.js' });
  assert.deepEqual(resolveReference('index.js', { specifier: '@scope/lib/sub.js', kind: 'import' }), { dependency: '@scope/lib' });
  assert.deepEqual(resolveReference('index.js', { specifier: 'lib', kind: 'import' }), { dependency: 'lib' });
  assert.deepEqual(resolveReference('index.js', { specifier: '/www/index.js', kind: 'import' }), { outside: '/www/index.js' });
  assert.deepEqual(resolveReference('index.js', { specifier: 'https://cdn.example/x.js', kind: 'url' }), { outside: 'https://cdn.example/x.js' });
  assert.deepEqual(resolveReference('index.js', { specifier: '../tests/x.js', kind: 'import' }), { outside: '../tests/x.js' });
});
