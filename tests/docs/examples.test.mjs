// The docs' runnable examples run: every fenced block of README.md and docs/*.md whose info string
// is `sh runnable` is a list of `kestrel` commands, each run with the dev build (KESTREL_CLI,
// default target/debug/kestrel) in the repository's root and expected to exit 0; a block marked
// `sh runnable-server` starts with a `kestrel serve` command, which runs on a free loopback port,
// and its other lines are curl calls to http://127.0.0.1:8080 (sent to that port instead), each
// expected to answer 200 with JSON and no `error`. Run by `./build.sh test` after the server tests
// (it needs the dev CLI, the default model and all-MiniLM-L6-v2), or alone:
// `node --test tests/docs/examples.test.mjs`.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const CLI = process.env.KESTREL_CLI ?? join(ROOT, 'target/debug/kestrel');
const DOCS = ['README.md', ...readdirSync(join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`)];
/** The address the examples' curl lines name. */
const EXAMPLE_ORIGIN = 'http://127.0.0.1:8080';

/** Every fenced block of `file` whose info string is `info`: its command lines, comments cut. */
function blocks(file, info) {
  const found = [];
  let current = null;
  for (const line of readFileSync(join(ROOT, file), 'utf8').split('\n')) {
    if (current === null && line.trim() === `\`\`\`${info}`) current = [];
    else if (current !== null && line.trim() === '```') {
      found.push(current);
      current = null;
    } else if (current !== null) {
      const command = line.replace(/\s+#.*$/, '').trim();
      if (command) current.push(command);
    }
  }
  return found;
}

/** A command line's words, as a POSIX shell splits simple quoting (the examples use no more). */
function words(line) {
  return [...line.matchAll(/'([^']*)'|"([^"]*)"|(\S+)/g)].map((m) => m[1] ?? m[2] ?? m[3]);
}

/** The program and arguments of an example's `kestrel` (or `target/release/kestrel`) command. */
function kestrelCommand(line) {
  const [program, ...args] = words(line);
  assert.ok(/(^|\/)kestrel$/.test(program), `not a kestrel command: ${line}`);
  return args;
}

async function freePort() {
  const probe = createServer();
  await new Promise((listening) => probe.listen(0, '127.0.0.1', listening));
  const { port } = probe.address();
  await new Promise((closed) => probe.close(closed));
  return port;
}

/** Starts `kestrel serve` with `args` on a free port; resolves to `{ origin, stop }` once it answers /health. */
async function serve(args) {
  const port = await freePort();
  const child = spawn(CLI, [...args.filter((a, i) => a !== '--port' && args[i - 1] !== '--port'), '--port', String(port)], { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (t) => (stderr += t));
  const origin = `http://127.0.0.1:${port}`;
  const stop = () => new Promise((done) => {
    if (child.exitCode !== null) return done();
    child.once('exit', done);
    child.kill('SIGTERM');
  });
  for (let tries = 0; tries < 600; tries++) {
    if (child.exitCode !== null) throw new Error(`kestrel serve exited with ${child.exitCode}: ${stderr}`);
    const up = await fetch(`${origin}/health`).then((r) => r.ok, () => false);
    if (up) return { origin, stop };
    await new Promise((r) => setTimeout(r, 200));
  }
  await stop();
  throw new Error(`kestrel serve did not answer in 2 minutes: ${stderr}`);
}

test('the runnable CLI examples of the docs exit 0', { timeout: 10 * 60_000 }, () => {
  const commands = DOCS.flatMap((file) => blocks(file, 'sh runnable').flat().map((line) => ({ file, line })));
  assert.ok(commands.length > 0, 'the docs mark runnable CLI examples');
  for (const { file, line } of commands) {
    try {
      execFileSync(CLI, kestrelCommand(line), { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (e) {
      assert.fail(`${file}: \`${line}\` failed: ${e.stderr}`);
    }
  }
});

test('the runnable server examples of the docs answer', { timeout: 10 * 60_000 }, async () => {
  const examples = DOCS.flatMap((file) => blocks(file, 'sh runnable-server').map((lines) => ({ file, lines })));
  assert.ok(examples.length > 0, 'the docs mark runnable server examples');
  for (const { file, lines } of examples) {
    const [start, ...calls] = lines;
    const server = await serve(kestrelCommand(start));
    try {
      for (const call of calls) {
        const [program, ...args] = words(call.replaceAll(EXAMPLE_ORIGIN, server.origin));
        assert.equal(program, 'curl', `${file}: not a curl call: ${call}`);
        const out = execFileSync('curl', [...args, '--fail-with-body', '--max-time', '300'], { encoding: 'utf8' });
        const answer = JSON.parse(out);
        assert.equal(answer.error, undefined, `${file}: \`${call}\` answered ${out}`);
      }
    } finally {
      await server.stop();
    }
  }
});
