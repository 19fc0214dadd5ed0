// Cargo's runner for wasm32-wasip1 test binaries (`./build.sh test`'s wasm kernel tests): runs
// one in Node's WASI on V8, the engine that runs the npm package's wasm in Chrome, with the
// arguments cargo passes (test filters, --nocapture) and its exit code.
import { readFile } from 'node:fs/promises';
import { argv, exit } from 'node:process';
import { WASI } from 'node:wasi';

const [file, ...args] = argv.slice(2);
if (!file) {
  console.error('usage: node wasi-run.mjs TEST.wasm [ARGS...]');
  exit(2);
}
const wasi = new WASI({ version: 'preview1', args: [file, ...args], env: { RUST_BACKTRACE: '1' }, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
