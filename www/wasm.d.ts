// The types of wasm.js: the engine's wasm module (crates/kestrel-wasm) as the worker uses it.
// wasm-bindgen writes declarations of its own into pkg/, but only when the wasm is built, which
// `./build.sh test` does after the type-check: these are what the type-check reads (wasm.js
// re-exports pkg/'s bindings under them). The JSON the module answers with is typed here as the
// worker reads it; kestrel-wasm's doc comments say what each call does.

import type { ChatCompletionChunk, Completion, EngineInfo, Estimate } from './index.d.ts';

/** An engine event (`Engine.step`) or a remote answer's (`RemoteAnswer`): a chunk, the answer or the error. */
export type AnswerEvent = {
  id: number;
  chunk?: ChatCompletionChunk | Completion;
  result?: unknown;
  error?: { code: string; message: string };
};

/** `Engine.loadChunk`'s progress. */
export type LoadChunkProgress = { bytes_received: number; tensors_loaded: number; tensors_total: number; file_bytes?: number };

/** `Engine.finishLoad`'s info, which the worker completes (the adapter, the cache, persistPrefix). */
export type LoadedInfo = EngineInfo;

/** The header estimate before the worker adds the adapter's limits. */
export type HeaderEstimate = Omit<Estimate, 'limits'> & { limits?: Estimate['limits'] };

export class Engine {
  private constructor();
  static create(options: string): Promise<Engine>;
  free(): void;
  abort(id: number): void;
  backend(): string;
  cachedTokenIds(): Uint32Array;
  cancelLoad(): void;
  checkDevice(): void;
  destroyDevice(): void;
  embed(body: string): Promise<unknown>;
  finishLoad(): Promise<LoadedInfo>;
  hasWork(): boolean;
  loadChunk(bytes: Uint8Array): LoadChunkProgress;
  loadDraft(): DraftLoad;
  loadNextShard(): void;
  promptTokens(id: number): Uint32Array;
  rerank(body: string): Promise<unknown>;
  reset(): void;
  restorePrefix(modelKey: string, bytes: Uint8Array, keep: number): number;
  savePrefix(modelKey: string, maxBytes: number): Promise<Uint8Array<ArrayBuffer> | undefined>;
  step(onEvent: (event: AnswerEvent) => void): Promise<unknown>;
  submit(endpoint: string, body: string): number;
  unload(): void;
  /** Only in the browser suite's build (kestrel-wasm's `test-hooks`). */
  trapForTest?: (how: string) => Promise<unknown>;
}

/** A draft model's load (`Engine.loadDraft`): its bytes in, as the engine's own load methods take the model's. */
export class DraftLoad {
  private constructor();
  free(): void;
  cancelLoad(): void;
  finishLoad(): Promise<LoadedInfo>;
  loadChunk(bytes: Uint8Array): LoadChunkProgress;
  loadNextShard(): void;
}

export class HeaderProbe {
  constructor();
  free(): void;
  estimate(options: string, maxBufferSize?: number, maxBinding?: number, deviceMemory?: number): HeaderEstimate;
  nextShard(): void;
  push(bytes: Uint8Array): boolean;
  restart(): void;
  shardCount(): number;
  startDraft(): void;
}

export class RemoteAnswer {
  constructor(id: number, endpoint: string, body: string, model: string);
  free(): void;
  done(generation: string, completionTokens?: number): AnswerEvent[];
  token(text: string, tokenId?: number, logprobs?: string): AnswerEvent[];
}

export class Sha256Hasher {
  constructor();
  free(): void;
  finishHex(): string;
  update(bytes: Uint8Array): void;
}

export function checkEmbeddingRequest(body: string): void;
export function checkRerankRequest(body: string): void;
export function peekPrefixSnapshot(bytes: Uint8Array): { key: string; tokens: Uint32Array } | { key?: undefined; tokens?: undefined; need: number };
export function reportPanicsTo(report: (message: string) => void): void;
export function reusableTokens(shared: number, promptLength: number): number;
export function shardNames(url: string): string[] | undefined;

/** Instantiates the module once per worker (later calls answer at once); resolves to its memory. */
export function initWasm(): Promise<WebAssembly.Memory>;
