// The engine's wasm module (crates/kestrel-wasm, which wasm-bindgen writes into pkg/) as the
// worker uses it, typed by wasm.d.ts (pkg/'s own declarations exist only after a wasm build).
import init from './pkg/kestrel_wasm.js';

export {
  DraftLoad, Engine, HeaderProbe, RemoteAnswer, Sha256Hasher, checkEmbeddingRequest, checkRerankRequest, peekPrefixSnapshot,
  reportPanicsTo, reusableTokens, shardNames,
} from './pkg/kestrel_wasm.js';

/** Instantiates the module (wasm-bindgen keeps one instance per realm); resolves to its memory. */
export async function initWasm() {
  return (await init({ module_or_path: new URL('./pkg/kestrel_wasm_bg.wasm', import.meta.url) })).memory;
}
