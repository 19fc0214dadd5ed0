// The messages between a page and the worker that hosts its engine (worker.js, or the shared
// engine's hub, shared-worker.js, in front of engine-host.js): every message either side sends,
// written once. The page side (index.js, shared.js) and the worker side (engine-host.js,
// shared-worker.js) name these through JSDoc. Not part of the package's public types.

import type {
  ChatCompletionChunk, Completion, EngineInfo, EngineStatus, LoadProgress, RemoteOptions,
} from './index.d.ts';

/** A model as the worker takes it: an absolute URL, a Blob or File, or a split model's shards. */
export type ModelInput = string | Blob | Blob[];

/** The engine's own options (createEngine's less the package's): the engine core checks them. */
export type EngineOptions = {
  backend?: 'webgpu' | 'cpu' | 'auto';
  context_length?: number;
  kv_cache?: 'f16' | 'f32';
  slots?: number;
  submit_budget_ms?: number;
  speculative?: { lookup?: boolean; maxDraft?: number };
  [option: string]: unknown;
};

/** `persistPrefix` as the worker takes it (null: off). */
export type Persist = { maxBytes: number } | null;

// Requests: what a page sends. Each has the id its answer ('progress', 'token', then 'result' or
// 'error') comes back under.

/** Loads `model` into the engine (createEngine); answers with its EngineInfo. */
export type LoadRequest = {
  type: 'load'; id: number; model: ModelInput; options: EngineOptions;
  sha256?: string | string[]; persist: Persist;
  /** false: neither read from nor store in the Cache API. */
  cache?: boolean;
  /** Speculative decoding's draft model, loaded after `model` onto the CPU backend. */
  draftModel?: ModelInput;
};
/** Makes a remote engine: its requests go to this OpenAI-compatible server (createEngine's `remote`). */
export type ConnectRequest = { type: 'connect'; id: number; remote: RemoteOptions };
/** `chat.completions.create` / `completions.create`'s argument less its `signal`. */
export type GenerateRequest = { type: 'generate'; id: number; endpoint: 'chat' | 'completions'; body: Record<string, unknown> };
/** `embeddings.create` ('embed') or `rerank`'s argument less its `signal`. */
export type EncodeRequest = { type: 'embed' | 'rerank'; id: number; body: Record<string, unknown> };
/** `estimate()`: whether a model fits, from its header. */
export type EstimateRequest = {
  type: 'estimate'; id: number; model: ModelInput; context_length?: number; kv_cache?: 'f16' | 'f32'; slots?: number;
  draftModel?: ModelInput;
};
/** The calls without arguments: `reset()`, `unload()`, `flush()`, `memory()`. */
export type PlainRequest = { type: 'reset' | 'unload' | 'flush' | 'memory'; id: number };
/** Test hook: loses the GPU device as a driver reset would (sent at once, not queued). */
export type DestroyDeviceRequest = { type: 'destroy-device'; id: number };
/** Test hook: traps the wasm instance (only the browser suite's build of the wasm has it). */
export type TrapRequest = { type: 'trap'; id: number; how: 'panic' | 'stack_overflow' | 'panic_in_future' };
/** Stops request `id` (no answer of its own: the request ends). */
export type AbortRequest = { type: 'abort'; id: number };

export type EngineRequest =
  | LoadRequest | ConnectRequest | GenerateRequest | EncodeRequest | EstimateRequest | PlainRequest
  | DestroyDeviceRequest | TrapRequest | AbortRequest;

/** A request before the page numbers it. */
export type RequestBody = WithoutId<EngineRequest>;
type WithoutId<T> = T extends unknown ? Omit<T, 'id'> : never;

// Replies: what the worker sends.

/** An error as it crosses to the page, which rebuilds it as a KestrelError. */
export type WireError = { code: string; message: string; remote?: { status: number; code: string | null } };

export type ProgressReply = { type: 'progress'; id: number; progress: LoadProgress };
/** A streamed chunk of a generation. */
export type TokenReply = { type: 'token'; id: number; chunk: ChatCompletionChunk | Completion };
/** A request's answer: load's EngineInfo, generate's completion (null once a stream ended), ... */
export type ResultReply = { type: 'result'; id: number; value: unknown };
export type ErrorReply = { type: 'error'; id: number; error: WireError };
/**
 * The engine's state, for every client: a device loss and the recovery from it ('device_lost',
 * 'reloading', then 'ready' with the info or 'failed' with the error), or a crash ('crashed'; the
 * shared engine's hub adds its worker's id, `engine`).
 */
export type StatusReply = {
  type: 'status'; id?: undefined; status: EngineStatus['status']; info?: EngineInfo; error?: WireError; engine?: string;
};
/** The shared engine's hub: how many tabs use it, and the requests of tabs that went away. */
export type ClientsReply = { type: 'clients'; id?: undefined; clients: number; abandoned_requests: number };
/** From shared.js itself: the leading tab closed, and what ran there is lost. */
export type LostReply = { type: 'lost'; id?: undefined };

/** What the engine host (engine-host.js) sends. */
export type HostReply = ProgressReply | TokenReply | ResultReply | ErrorReply | StatusReply;
/** What a page hears from its worker or its shared engine's connection. */
export type Reply = HostReply | ClientsReply | LostReply;

// The shared engine's own messages (shared.js <-> shared-worker.js).

/** A tab connects (`lock`: its Web Lock while it lives; `rejoin`: it lost the old leader). */
export type HelloMessage = { type: 'hello'; lock: string; rejoin?: boolean };
/** A tab leaves. */
export type ByeMessage = { type: 'bye' };
/** To the leading tab's dedicated worker: serve the tabs on BroadcastChannel `channel`. */
export type LeadMessage = { type: 'lead'; channel: string; leader: string; rejoin: boolean };
/** What a tab sends its hub. */
export type HubRequest = EngineRequest | HelloMessage | ByeMessage;
/** On the leader's BroadcastChannel: a follower's message to the leader. */
export type ToLeader = { to: 'leader'; from: string; msg: HubRequest };
/**
 * On the leader's BroadcastChannel: the leader's to one tab (`to` its id: 'welcome', then what
 * the hub answers it) or to every tab (`to` '*': 'leader', a new leader's announcement).
 */
export type FromLeader = { to: string; leader: string; msg: Reply | { type: 'welcome' } | { type: 'leader' } };
export type ChannelMessage = ToLeader | FromLeader;
