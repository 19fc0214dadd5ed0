// The docs are checked: every relative link of README.md, CHANGELOG.md and docs/*.md resolves to a
// file of the repository (and its #anchor to a heading, or an explicit id, of that file); the
// README stays a front page (under 250 lines, the quick start in its first 40); and the
// benchmark tables of README.md and docs/benchmarks.md are what bench/summary.mjs makes from
// bench/results/, so they cannot go stale. Run by `./build.sh test` ("docs links"), or alone:
// `node --test tests/docs/links.test.mjs`. Needs nothing but Node.
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { expectedFiles, gpuTable, parseGpuCheck } from '../../bench/summary.mjs';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const DOCS = [
  'README.md',
  'CHANGELOG.md',
  ...readdirSync(join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`),
];

/** The text of a Markdown file with fenced code blocks and inline code spans blanked out (line
 * numbers kept), so that a link written as an example in code is not taken for a link. */
function prose(text) {
  const lines = text.split('\n');
  let fence = null;
  return lines.map((line) => {
    const m = line.match(/^\s*(`{3,}|~{3,})/);
    if (fence) {
      if (m && m[1][0] === fence[0] && m[1].length >= fence.length) fence = null;
      return '';
    }
    if (m) {
      fence = m[1];
      return '';
    }
    return line.replace(/(`+)[^`]*?\1/g, '');
  }).join('\n');
}

/** Every inline link and image target of a Markdown text, with its line: [text](target "title"). */
export function links(text) {
  const out = [];
  prose(text).split('\n').forEach((line, i) => {
    for (const m of line.matchAll(/!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) out.push({ target: m[1], line: i + 1 });
    for (const m of line.matchAll(/<a\s[^>]*href="([^"]+)"/g)) out.push({ target: m[1], line: i + 1 });
  });
  return out;
}

/** GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`. */
export function slug(heading) {
  const text = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // a link's text
    .replace(/<[^>]+>/g, '')
    .trim()
    .toLowerCase();
  return text.replace(/[^\p{L}\p{N}\s_-]/gu, '').replace(/\s/g, '-');
}

/** The anchors a Markdown file has: its headings' slugs (repeats numbered as GitHub numbers them)
 * and explicit `id` / `name` attributes. */
export function anchors(text) {
  const seen = new Map();
  const out = new Set();
  let fence = null;
  for (const line of text.split('\n')) {
    const f = line.match(/^\s*(`{3,}|~{3,})/);
    if (fence) {
      if (f && f[1][0] === fence[0] && f[1].length >= fence.length) fence = null;
      continue;
    }
    if (f) {
      fence = f[1];
      continue;
    }
    const h = line.match(/^#{1,6}\s+(.*?)\s*#*\s*$/);
    if (h) {
      const base = slug(h[1]);
      const n = seen.get(base) ?? 0;
      seen.set(base, n + 1);
      out.add(n ? `${base}-${n}` : base);
    }
    for (const m of line.matchAll(/<[a-z]+\s[^>]*(?:id|name)="([^"]+)"/g)) out.add(m[1]);
  }
  return out;
}

test('every relative link of the README, the CHANGELOG and docs/*.md resolves, anchors included', () => {
  const broken = [];
  let checked = 0;
  for (const doc of DOCS) {
    const file = join(ROOT, doc);
    for (const { target, line } of links(readFileSync(file, 'utf8'))) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith('//')) continue; // https:, mailto:, ...
      checked += 1;
      const [pathPart, anchor] = target.split('#');
      const path = decodeURIComponent(pathPart);
      const dest = path ? resolve(dirname(file), path) : file;
      const where = `${doc}:${line}: ${target}`;
      if (!dest.startsWith(ROOT)) {
        broken.push(`${where} (outside the repository)`);
        continue;
      }
      if (!existsSync(dest)) {
        broken.push(`${where} (no ${relative(ROOT, dest)})`);
        continue;
      }
      if (anchor && statSync(dest).isFile() && dest.endsWith('.md') && !anchors(readFileSync(dest, 'utf8')).has(decodeURIComponent(anchor))) {
        broken.push(`${where} (no heading #${anchor} in ${relative(ROOT, dest)})`);
      }
    }
  }
  assert.ok(checked > 50, `only ${checked} relative links found: is the link parser broken?`);
  assert.deepEqual(broken, [], `broken links:\n${broken.join('\n')}`);
});

test('the README is a front page: under 250 lines, the quick start within its first 40', () => {
  const lines = readFileSync(join(ROOT, 'README.md'), 'utf8').split('\n');
  assert.ok(lines.length < 250, `README.md has ${lines.length} lines`);
  const start = lines.findIndex((l) => l.startsWith('```js'));
  const end = lines.findIndex((l, i) => i > start && l.startsWith('```'));
  assert.ok(start >= 0 && end > start, 'README.md has no js block');
  const code = lines.slice(start + 1, end).join('\n');
  assert.ok(code.includes("from '@kestrel-llm/web'") && code.includes('createEngine(') && code.includes('for await'), 'the first js block is not the quick start');
  assert.ok(end < 40, `the quick start ends on line ${end + 1}`);
  assert.ok(end - start - 1 <= 5, `the quick start is ${end - start - 1} lines`);
});

test("the README's and docs/benchmarks.md's benchmark tables are bench/summary.mjs's, from bench/results/", () => {
  for (const [path, { current, expected }] of Object.entries(expectedFiles(ROOT))) {
    assert.ok(current === expected, `${path}'s generated benchmark part is stale: run \`node bench/summary.mjs\` (it rewrites it from bench/results/latest.json)`);
  }
});

test('the real-GPU table takes only a real GPU\'s bench/gpu-check.sh output', () => {
  const output = (adapter) => [
    '# Kestrel GPU check (2026-12-08T10:00:00Z, kestrel 0.1.0)', '',
    `adapter: ${adapter}  `, 'features: subgroups', '', '## synthetic 1b', '',
    `adapter: ${adapter}  `, '', 'load 812 ms, copy 1800.00 GB/s', '',
    '| prompt | decode | TTFT ms | prefill tok/s | decode tok/s | ITL p50 / p90 / p99 ms |', '|--:|--:|--:|--:|--:|--:|',
    '| 128 | 64 | 20.1 (19.0–21.0) | 6400.5 (6300.0–6500.0) | 410.2 (400.0–420.0) | 2.4 / 2.5 / 2.9 |', '',
    '## synthetic 1b, batched decode', '', '| batch | decode tok/s (all sequences) | range | x |', '|--:|--:|--:|--:|', '| 8 | 3000.0 | 1-2 | 7.3x |',
  ].join('\n');
  const real = parseGpuCheck(output('NVIDIA H100 (Vulkan, NVIDIA 560.35)'));
  assert.equal(real.software, false);
  assert.deepEqual(real.rows, [{ shape: '1b', prompt: 128, decode_tokens: 64, prefill: 6400.5, decode: 410.2 }]);
  assert.ok(gpuTable(output('NVIDIA H100 (Vulkan, NVIDIA 560.35)')).some((l) => l.startsWith('| 2026-12-08 | NVIDIA H100')));
  const emulated = gpuTable(output('llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Mesa 22.3.6, software)'));
  assert.ok(!emulated.some((l) => l.startsWith('| 2026')) && emulated.some((l) => l.includes('software adapter')));
  assert.ok(gpuTable(null).some((l) => l.startsWith('Empty')));
});
