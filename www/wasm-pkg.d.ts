// What wasm.js imports of pkg/kestrel_wasm.js (wasm-bindgen's glue), for tsconfig.wasm.json's
// check of wasm.js alone: the bindings as wasm.d.ts types them, and the glue's default export
// (its `init`, which resolves to the instance's exports). That check reads no file of pkg/
// (`noResolve`), which exists only after the wasm build: this declaration stands for it.

declare module '*/pkg/kestrel_wasm.js' {
  // 'kestrel-wasm-bindings' is wasm.d.ts (tsconfig.wasm.json's `paths`: an ambient module
  // declaration cannot name a relative path).
  export {
    DraftLoad, Engine, HeaderProbe, RemoteAnswer, Sha256Hasher, checkEmbeddingRequest, checkRerankRequest, peekPrefixSnapshot,
    reportPanicsTo, reusableTokens, shardNames,
  } from 'kestrel-wasm-bindings';

  /** Instantiates the module from `module_or_path`; resolves to the instance's exports. */
  export default function init(options: { module_or_path: URL }): Promise<{ readonly memory: WebAssembly.Memory }>;
}
