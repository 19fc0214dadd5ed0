// The npm package as `npm pack ./www` would publish it: the documents and licenses a user reads
// on the registry, every file its modules load (a module someone adds but forgets to list in
// "files" fails here, not in a user's app), nothing of the repository's tests, demo or bench,
// the metadata npm shows, and publint's verdict. Needs www/pkg (`./build.sh wasm`): the wasm is
// part of what is published.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { publint } from 'publint';
import { formatMessage } from 'publint/utils';
import { moduleReferences, resolveReference } from './module-references.mjs';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const WWW = join(ROOT, 'www');
const manifest = JSON.parse(readFileSync(join(WWW, 'package.json'), 'utf8'));

/** The package's paths in the tarball (npm pack's listing, without writing the tarball). */
let shipped;

before(() => {
  if (!existsSync(join(WWW, 'pkg/kestrel_wasm_bg.wasm'))) {
    throw new Error('www/pkg is missing: `./build.sh wasm` builds it (npm pack would silently leave it out)');
  }
  const [packed] = JSON.parse(execFileSync('npm', ['pack', '--dry-run', '--json', WWW], { cwd: ROOT, encoding: 'utf8' }));
  shipped = new Set(packed.files.map((f) => f.path));
});

const read = (path) => readFileSync(join(WWW, path), 'utf8');

test('the tarball has the README, both licenses of the license expression and the CHANGELOG', () => {
  for (const file of ['README.md', 'CHANGELOG.md', 'LICENSE-MIT', 'LICENSE-APACHE']) assert.ok(shipped.has(file), `${file} is not in the tarball`);
  // The expression names two licenses; each one's text ships, with the copyright holder.
  assert.equal(manifest.license, 'MIT OR Apache-2.0');
  assert.match(read('LICENSE-MIT'), /^MIT License\n\nCopyright \(c\) The Kestrel developers\n\nPermission is hereby granted, free of charge/);
  assert.match(read('LICENSE-APACHE'), /Apache License\s+Version 2\.0, January 2004[\s\S]+END OF TERMS AND CONDITIONS/);
  assert.match(read('CHANGELOG.md'), new RegExp(`^## ${manifest.version.replaceAll('.', '\\.')}\\b`, 'm'), 'the CHANGELOG has no entry for the version');
  const readme = read('README.md');
  assert.ok(readme.includes(`npm install ${manifest.name}`), 'the README says how to install the package');
  assert.ok(readme.includes(`from '${manifest.name}'`) && readme.includes('createEngine('), 'the README has the quick start');
});

test("the README's model links are download links, which createEngine can load", () => {
  const links = read('README.md').match(/https:\/\/huggingface\.co\/[^\s)>\]]+\.gguf/g) ?? [];
  assert.ok(links.length >= 5, `the README lists few models: ${links.join(' ')}`);
  // A /blob/ link is the hub's web page of the file; createEngine refuses it as bad_model.
  for (const link of links) assert.match(link, /^https:\/\/huggingface\.co\/[\w.-]+\/[\w.-]+\/resolve\/main\/[\w.-]+\.gguf$/, link);
});

/** The package's entry points: "main", "types" and each "exports" target that is not a pattern. */
function entryPoints() {
  const targets = [];
  const walk = (value) => {
    if (typeof value === 'string') targets.push(value);
    else if (value && typeof value === 'object') Object.values(value).forEach(walk);
  };
  walk(manifest.exports);
  return [manifest.main, manifest.types, ...targets].filter((t) => t && !t.includes('*')).map((t) => t.replace(/^\.\//, ''));
}

test('every entry point ships, and so does every file a shipped module loads', () => {
  for (const entry of entryPoints()) assert.ok(shipped.has(entry), `the entry point ${entry} is not in the tarball`);
  const modules = [...shipped].filter((p) => /\.(m?js|d\.ts)$/.test(p));
  assert.ok(modules.includes('worker.js') && modules.includes('pkg/kestrel_wasm.js'), `modules: ${modules.join(' ')}`);
  const missing = [];
  for (const from of modules) {
    for (const reference of moduleReferences(read(from), from)) {
      const target = resolveReference(from, reference);
      if (target.file && !shipped.has(target.file)) missing.push(`${from} loads ${target.file}`);
      if (target.outside) missing.push(`${from} loads ${target.outside}, outside the package`);
      // An integration's framework is the app's: a peer dependency, optional for the rest of the package.
      const declared = manifest.dependencies?.[target.dependency] ?? manifest.peerDependencies?.[target.dependency];
      if (target.dependency && !declared) missing.push(`${from} imports ${target.dependency}, not a dependency`);
    }
  }
  assert.deepEqual(missing, [], 'files the package loads but does not ship (add them to "files" in www/package.json)');
});

test('nothing ships that the package does not load: no tests, demo, bench or dev tools', () => {
  // From the entry points, following each module's references: what a user's app can reach.
  const reachable = new Set();
  const queue = entryPoints();
  while (queue.length) {
    const file = queue.pop();
    if (reachable.has(file) || !shipped.has(file)) continue;
    reachable.add(file);
    if (!/\.(m?js|d\.ts)$/.test(file)) continue;
    for (const reference of moduleReferences(read(file), file)) {
      const { file: next } = resolveReference(file, reference);
      if (next) queue.push(next);
    }
  }
  // Declarations of the wasm glue are for TypeScript users of "./pkg/*"; the rest is documents.
  const documents = new Set(['package.json', 'README.md', 'CHANGELOG.md', 'LICENSE-MIT', 'LICENSE-APACHE']);
  const unused = [...shipped].filter((p) => !reachable.has(p) && !documents.has(p) && !p.endsWith('.d.ts'));
  assert.deepEqual(unused, [], 'shipped files that no entry point loads');
  const devFiles = [...shipped].filter((p) => /(^|\/)(tests?|demo|bench|node_modules)\/|\.test\.|(^|\/)(serve|chromium)\.mjs$|tsconfig\.json$/.test(p));
  assert.deepEqual(devFiles, [], 'test, demo, bench or dev files in the tarball');
});

test('the AI SDK provider declares the ai majors it supports as an optional peer dependency', () => {
  // ai-sdk.js gives each supported `ai` major the specification it calls (SPECIFICATIONS) and
  // refuses any other with a KestrelError; this range lets npm warn of those at install time.
  const table = read('ai-sdk.js').match(/^const SPECIFICATIONS = \{([^}]*)\};$/m)[1];
  const majors = [...table.matchAll(/(\d+): 'v\d'/g)].map((m) => Number(m[1]));
  assert.deepEqual(majors, [5, 6, 7]);
  assert.equal(manifest.peerDependencies?.ai, `>=${majors[0]} <${majors.at(-1) + 1}`);
  assert.deepEqual(manifest.peerDependenciesMeta?.ai, { optional: true });
  // Its declarations take the model types from `ai`, whose own @ai-sdk/provider differs by major.
  assert.equal(manifest.peerDependencies?.['@ai-sdk/provider'], undefined);
});

test("the wasm has none of the browser suite's test hooks", async () => {
  // kestrel-wasm's `test-hooks` (`trapForTest`) is for the suite's own build of the wasm.
  const module = await WebAssembly.compile(readFileSync(join(WWW, 'pkg/kestrel_wasm_bg.wasm')));
  const hooks = WebAssembly.Module.exports(module).map((e) => e.name).filter((name) => /trap/i.test(name));
  assert.deepEqual(hooks, [], 'the wasm exports a test hook: build www/pkg without the test-hooks feature');
  assert.doesNotMatch(read('pkg/kestrel_wasm.js'), /trapForTest/);
});

test('package.json has the metadata the registry shows', () => {
  assert.deepEqual(manifest.repository, { type: 'git', url: 'git+https://github.com/kestrel-llm/kestrel.git', directory: 'www' });
  assert.match(manifest.homepage, /^https:\/\/github\.com\/kestrel-llm\/kestrel\b/);
  assert.match(manifest.bugs?.url ?? '', /^https:\/\/github\.com\/kestrel-llm\/kestrel\/issues$/);
  for (const word of ['llm', 'webgpu', 'wasm', 'gguf', 'llama', 'inference', 'openai', 'browser']) {
    assert.ok(manifest.keywords?.includes(word), `keywords lack ${word}: ${manifest.keywords}`);
  }
  assert.ok(manifest.description?.length > 20, 'a description');
});

test('publint finds no errors or warnings', async () => {
  // pack: 'npm' lets publint tell a file that is missing from one that exists but is not published.
  const { messages } = await publint({ pkgDir: WWW, pack: 'npm', level: 'suggestion' });
  const lines = messages.map((m) => `${m.type} ${m.code}: ${formatMessage(m, manifest)}`);
  // Suggestions are advice (none today); they are printed, not failed on.
  for (const line of lines.filter((l) => l.startsWith('suggestion'))) console.log(line);
  assert.deepEqual(lines.filter((l) => !l.startsWith('suggestion')), []);
});
