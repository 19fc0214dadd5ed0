// Types of the `kestrel` browser package.

/**
 * The stable codes of KestrelError:
 * - loading: `bad_model` (not a GGUF file, a corrupt one, a wrong sha256, or a URL that answered
 *   with a web page), `unsupported_quant`, `fetch_failed`, `device_limits` (the model does not fit
 *   this device, with the numbers), `out_of_memory`, `no_webgpu`;
 * - requests: `invalid_option` (a bad option, named in the message), `context_overflow`,
 *   `template` (the model's chat template failed), `tokenizer`, `no_model`, `busy`, `needs_gpu`;
 * - the GPU: `gpu`, `device_lost` (the engine recovers by itself, see EngineStatus);
 * - saved KV prefixes: `bad_snapshot`, `snapshot_mismatch`;
 * - the engine: `worker_error` (its worker could not start), `unloaded`, `internal` (a bug; a
 *   crash of the engine, which then recovers by itself, see EngineStatus);
 * - `remote_error`: the `remote` server failed or answered with a code of its own (in `remote`).
 */
export type KestrelErrorCode =
  | 'bad_model' | 'unsupported_quant' | 'fetch_failed' | 'device_limits' | 'out_of_memory' | 'no_webgpu'
  | 'invalid_option' | 'context_overflow' | 'template' | 'tokenizer' | 'no_model' | 'busy' | 'needs_gpu'
  | 'gpu' | 'device_lost' | 'bad_snapshot' | 'snapshot_mismatch'
  | 'worker_error' | 'unloaded' | 'internal' | 'remote_error' | 'leader_lost';

/** Every error the package throws or rejects with: `code` is stable, `message` precise. */
export declare class KestrelError extends Error {
  constructor(code: KestrelErrorCode, message: string, details?: { remote?: { status: number; code: string | null } });
  readonly name: 'KestrelError';
  readonly code: KestrelErrorCode;
  /** With code `remote_error` from a server's answer (and codes mapped from one): its HTTP status and its own code. */
  readonly remote?: { status: number; code: string | null };
}

/** Whether `e` is a KestrelError (also one from another copy of the package, where `instanceof` is false). */
export function isKestrelError(e: unknown): e is KestrelError;

export interface LoadProgress {
  phase: 'download' | 'cache' | 'upload' | 'compile' | 'ready';
  /** Bytes read so far. */
  loaded: number;
  /**
   * Bytes in the file: the Content-Length, else the size its header declares once that has arrived
   * (0 before). A split model's: all its shards' (from their headers, when downloading).
   */
  total: number;
  tensors?: number;
  tensorsTotal?: number;
  /** A split model's: the shard being read (from 1), and how many it has. */
  shard?: number;
  shards?: number;
  /** true: the draft model's load (createEngine's `draftModel`), which follows the model's 'ready'. */
  draft?: boolean;
}

/** The shared engine (createEngine's `shared`) as this tab sees it. */
export interface SharedEngineInfo {
  /**
   * 'shared-worker': a SharedWorker runs it; where the browser has none, the tabs elect one to run
   * it in its worker ('leader': this tab) and the others reach it over a BroadcastChannel ('follower').
   */
  mode: 'shared-worker' | 'leader' | 'follower';
  /** The tabs connected to it now. */
  clients: number;
  /** Requests ended because the tab that asked closed or navigated away before their answer. */
  abandoned_requests: number;
}

/** A chat (text generation) model's hyper-parameters and how the engine runs it: `EngineInfo.model` where `kind` is 'chat'. */
export interface ChatModelInfo {
  name: string; arch: string; n_layers: number; hidden: number; ffn: number; n_heads: number;
  n_kv_heads: number; head_dim: number; vocab: number; train_context: number; context_length: number;
  tied_embeddings: boolean; weight_bytes: number; weight_bytes_per_token: number; chat_template: boolean;
  /** Requests generated at once as one batch (the `slots` option). */
  slots: number;
  /** Prompt tokens a batched step runs at most (the `prefill_chunk` option). */
  prefill_chunk: number;
  /** Whether requests run as batched steps (several slots, or the CPU backend); else one at a time. */
  batched: boolean;
  /** The GPU time one submission of a prompt may take (the `submit_budget_ms` option); null: none, or the CPU backend. */
  submit_budget_ms: number | null;
}

/** An embedding model's: `EngineInfo.model` where `kind` is 'embedding'. */
export interface EmbeddingModelInfo {
  name: string;
  /** 'bert' or 'nomic-bert'. */
  arch: string;
  /** The length of its vectors (`embeddings.create`'s `dimensions` keeps fewer). */
  dimensions: number;
  /** The longest input in tokens, the special tokens included. */
  context_length: number;
  /** How the tokens' vectors become one: 'mean', 'cls' or 'last' (the file's `pooling_type`). */
  pooling: 'mean' | 'cls' | 'last';
  weight_bytes: number;
  n_layers: number; hidden: number; n_heads: number; vocab: number; train_context: number;
}

/**
 * A reranker's (a bert cross-encoder, `pooling_type` 4): `EngineInfo.model` where `kind` is
 * 'reranker'. `context_length` bounds each query-document pair's tokens.
 */
export interface RerankerModelInfo extends Omit<EmbeddingModelInfo, 'pooling'> {
  /** Rank pooling: the [CLS] row through the file's classifier head. */
  pooling: 'rank';
}

interface EngineInfoCommon {
  /**
   * Where generation runs: this browser's GPU, its CPU (wasm SIMD in the engine's worker), or the
   * `remote` server of createEngine. An encoder the GPU kernels cannot run (`backend_reason`
   * says why) runs on the CPU backend whatever `backend` asked for.
   */
  backend: 'webgpu' | 'cpu' | 'remote';
  /**
   * With backend 'cpu': why (asked for, no WebGPU, a software adapter, the model does not fit the
   * GPU, an embedding model the GPU does not run).
   */
  backend_reason?: string | null;
  /** With backend 'cpu': the SIMD instruction set of its kernels and its threads. */
  cpu?: { simd: string; threads: number } | null;
  /** With backend 'remote': why the model does not run here (`no_webgpu`, `device_limits`, `out_of_memory`). */
  fallback?: { code: string; message: string };
  /** With backend 'remote': the server and the model asked of it. */
  remote?: { baseURL: string; model: string };
  /** With createEngine's `shared`: how this tab reaches the shared engine and how many tabs use it; else null. */
  shared?: SharedEngineInfo | null;
  gpu: {
    adapter: string;
    backend: string;
    driver: string;
    features: { shader_f16: boolean; subgroups: boolean; timestamps: boolean; subgroup_min_size: number; subgroup_max_size: number };
    limits: Record<string, number>;
    /** A software (CPU-emulated) adapter: SwiftShader, llvmpipe, WARP. */
    software: boolean;
    /**
     * Kernel variants chosen for this adapter: the decode matvec's threads per row and rows per
     * thread, and the fewer rows a thread the types with wide units get (`matvec_wide_unit_types`:
     * Q5_0, Q5_1, Q5_K, Q6_K, F16, F32).
     */
    kernels: {
      matvec_slices: number;
      matvec_rows_per_thread: number;
      matvec_wide_unit_rows: number;
      matvec_wide_unit_types: string[];
    };
    /** The browser's own description of the adapter (GPUAdapterInfo), where it gives one. */
    adapter_info?: { vendor: string; architecture: string; device: string; description: string };
  } | null;
  /** The wasm engine's version (null with backend 'remote'). */
  version: string | null;
  /**
   * With a local engine (either backend): whether the Cache API keeps the model file (a URL loaded
   * with the cache on), and why not where storing failed: `quota_exceeded` (the site's storage quota has no room;
   * the model ran from the network and downloads again next time) or `cache_failed`.
   */
  model_cache?: { stored: boolean; error: { code: 'quota_exceeded' | 'cache_failed'; message: string } | null };
  /**
   * With `persistPrefix`: whether KV prefixes are saved and restored, and why not where they are
   * not (the CPU backend keeps no snapshots; the Origin Private File System is missing). Null
   * without the option.
   */
  persist_prefix?: { enabled: boolean; reason: string | null } | null;
  /**
   * With `speculative` (or `draftModel`): how the engine speculates (`maxDraft`, whether by prompt
   * lookup, its draft model's name or null), or why it does not (an embedding model; a draft
   * model not loaded yet). Null without the option.
   */
  speculative?: SpeculativeInfo | null;
}

/** `EngineInfo.speculative`. */
export type SpeculativeInfo =
  | { enabled: true; lookup: boolean; maxDraft: number; draftModel: string | null }
  | { enabled: false; reason: string };

/**
 * What the engine runs (`engine.info`). `kind` says what its model does, and narrows `model`:
 * 'chat' (it generates: `chat.completions`, `completions`), 'embedding' (it embeds:
 * `embeddings.create`), 'reranker' (it scores documents against a query: `rerank`), or null for
 * a remote engine (the server decides; `model` is null).
 */
export type EngineInfo =
  | (EngineInfoCommon & { kind: 'chat'; model: ChatModelInfo })
  | (EngineInfoCommon & { kind: 'embedding'; model: EmbeddingModelInfo })
  | (EngineInfoCommon & { kind: 'reranker'; model: RerankerModelInfo })
  | (EngineInfoCommon & { kind: null; model: null });

export interface ChatMessage {
  role: 'system' | 'developer' | 'user' | 'assistant' | 'tool' | (string & {});
  /** May be null or absent on an assistant message that made tool calls. */
  content: string | null;
  /** An assistant message's calls (as a completion returned them). */
  tool_calls?: ToolCall[];
  /** A `tool` message: the call it answers. */
  tool_call_id?: string;
}

/** A function the model may call (OpenAI's `tools` entry). */
export interface Tool {
  type: 'function';
  function: {
    /** 1 to 64 letters, digits, `_` or `-`; unique in the request. */
    name: string;
    description?: string;
    /** A JSON Schema of the arguments object; the arguments always validate against it. */
    parameters?: Record<string, unknown>;
    strict?: boolean;
  };
}

/** A call the model made; `arguments` is JSON text. */
export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export type ToolChoice = 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } };

/**
 * Generation options (kestrel_model::GenerateOptions, under the same names); absent ones take
 * llama.cpp's defaults (max_tokens 256, temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * penalty_last_n 64, no penalties). An option out of range, or past one of the limits below,
 * fails the request with code `invalid_option` and a message naming the option.
 */
export interface SamplingOptions {
  /** Most tokens to generate: an integer of at least 1 (generation also ends when the context is full, finish_reason "length"). */
  max_tokens?: number;
  /** In [0, 2], as OpenAI's; 0 is greedy. */
  temperature?: number;
  /** In [0, 1], as OpenAI's; 1 disables it. */
  top_p?: number;
  /** An integer of at least 0; 0 disables it. */
  top_k?: number;
  /** In [0, 1]; 0 disables it. */
  min_p?: number;
  /** An integer of at least 0. Same seed, same tokens (default: drawn from the clock). */
  seed?: number;
  /** Stop when the text contains one of these (not part of the output); at most 16, each 1 to 512 bytes. */
  stop?: string | string[];
  /** Stop after one of these tokens (at most 1024). */
  stop_token_ids?: number[];
  /** `{ "token id": bias }`, at most 1024 entries, each bias in [-100, 100] as OpenAI's; `-Infinity` bans the token. */
  logit_bias?: Record<string, number>;
  /** A finite number above 0; 1 disables it. */
  repetition_penalty?: number;
  /** In [-2, 2], as OpenAI's. */
  frequency_penalty?: number;
  /** In [-2, 2], as OpenAI's. */
  presence_penalty?: number;
  /** How many recent tokens the penalties look at: an integer from 0 to 4096. */
  penalty_last_n?: number;
  /** Keep going past the model's end-of-generation tokens. */
  ignore_eos?: boolean;
  /**
   * false: this request decodes one token per step, without the engine's speculative decoding
   * (createEngine's `speculative`); default true. The tokens are the same either way for a greedy
   * request, and follow the same distribution for a sampled one.
   */
  speculative?: boolean;
  /**
   * Report log-probabilities in `choices[0].logprobs`, in OpenAI's shape: `ChatLogprobs` for chat
   * completions, `CompletionLogprobs` for text completions (a streamed chunk carries those of its
   * token); with the token ids in `kestrel.logprobs`.
   */
  logprobs?: boolean;
  /** With `logprobs`: how many of the most likely tokens each step reports, an integer from 0 to 20 (default 1; 0 reports 1). */
  top_logprobs?: number;
  /**
   * OpenAI's structured output: the answer is a JSON object, or JSON valid against
   * `json_schema.schema` (nested objects, arrays with bounds, enums, `anyOf`/`oneOf`,
   * `$ref`/`$defs`, string formats and patterns, numeric bounds; an unsupported keyword such as
   * `uniqueItems` fails with `invalid_option`). At most one of `response_format`, `regex` and
   * `grammar`.
   */
  response_format?: ResponseFormat;
  /** The whole answer matches this regular expression (Rust `regex` syntax). */
  regex?: string;
  /** The answer follows this grammar, in llguidance's Lark syntax. */
  grammar?: string;
  /** Aborting stops generation at the next token, with finish_reason "abort". */
  signal?: AbortSignal;
}

/** OpenAI's `response_format`. */
export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; json_schema: { name: string; description?: string; schema?: Record<string, unknown> | boolean; strict?: boolean } };

export type FinishReason = 'stop' | 'length' | 'abort' | 'tool_calls';

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** OpenAI's: the prompt tokens the KV cache already held (`extra.reused_tokens`). */
  prompt_tokens_details: { cached_tokens: number };
  extra: {
    prefill_tokens: number;
    reused_tokens: number;
    prefill_tokens_per_s: number;
    decode_tokens_per_s: number;
    time_to_first_token_s: number;
    time_per_output_token_s: number;
    /** Time the worker spent blocked waiting for decode steps' tokens, per token (steps run ahead keep the GPU busy meanwhile). */
    host_wait_per_output_token_s: number;
    /** With a submission budget on the GPU (else null): the prompt's GPU submissions, and the longest one's time from its submit to its end. */
    prefill_submissions: number | null;
    longest_prefill_submission_s: number | null;
    e2e_latency_s: number;
  };
}

/** The engine's own timings of one generation. */
export interface Timings {
  prompt_tokens: number;
  /** Prompt tokens run (the rest were reused from the KV cache). */
  prefill_tokens: number;
  reused_tokens: number;
  ttft_ms: number;
  prefill_tok_s: number;
  decode_tokens: number;
  decode_ms: number;
  decode_tok_s: number;
  host_wait_ms_per_token: number;
  /** With a submission budget on the GPU (else null): the prompt's submissions, and the longest one's time. */
  prefill_submissions: number | null;
  longest_prefill_submission_ms: number | null;
  /** From the engine receiving the request to the result, queueing included. */
  e2e_ms: number;
}

/** Non-standard details of the generation. */
export interface KestrelDetails {
  prompt_token_ids: number[];
  token_ids: number[];
  timings: Timings;
  /**
   * With `logprobs`, each generated step: the token's id, log-probability and bytes, and the most
   * likely tokens (best first) as `[id, logprob]` with their bytes in `top_bytes`. What
   * `choices[0].logprobs` shows, with the ids OpenAI's shape lacks.
   */
  logprobs: { token_id: number; logprob: number; bytes: number[]; top: [number, number][]; top_bytes: number[][] }[];
  /**
   * Where speculative decoding served the request: the tokens drafted and verified, those kept,
   * and the model's steps that verified a draft (each also gave a token of its own).
   */
  speculative?: { drafted: number; accepted: number; verifications: number };
}

/**
 * One token of an answer in OpenAI's chat `logprobs`. `token` is its text (a token holding part of
 * a UTF-8 character shows U+FFFD for it; `bytes` holds it exactly).
 */
export interface TopLogprob {
  token: string;
  logprob: number;
  bytes: number[];
}

export interface TokenLogprob extends TopLogprob {
  /** The most likely tokens of the step, best first. */
  top_logprobs: TopLogprob[];
}

/** OpenAI's chat `logprobs`: the answer's tokens in order (a streamed chunk: its token's). */
export interface ChatLogprobs {
  content: TokenLogprob[];
  refusal: null;
}

/**
 * OpenAI's text-completion `logprobs`: the tokens, their log-probabilities, the most likely tokens
 * of each step by text, and where each token starts in the answer's text (in characters, going on
 * from chunk to chunk in a stream).
 */
export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Record<string, number>[];
  text_offset: number[];
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  system_fingerprint: null;
  choices: {
    index: 0;
    delta: { role?: 'assistant'; content?: string; tool_calls?: (ToolCall & { index: number })[] };
    finish_reason: FinishReason | null;
    /** The token this chunk's text came from (null for a final flush of held-back text). */
    token_id?: number | null;
    /** With `logprobs`, this chunk's token's; the final chunk's: any no chunk carried (a remote or stored answer). */
    logprobs: ChatLogprobs | null;
  }[];
  /**
   * On the final chunk (the one with `finish_reason`); with `stream_options.include_usage`, also on
   * the chunk after it, whose `choices` is empty, as OpenAI sends it.
   */
  usage?: Usage;
  /** On the final chunk. */
  kestrel?: KestrelDetails;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  system_fingerprint: null;
  choices: {
    index: 0;
    /** With tool calls, `content` is the text around them (null when there is none). */
    message: { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] };
    finish_reason: FinishReason;
    logprobs: ChatLogprobs | null;
  }[];
  usage: Usage;
  kestrel: KestrelDetails;
}

export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  system_fingerprint: null;
  choices: { index: 0; text: string; finish_reason: FinishReason | null; token_id?: number | null; logprobs: CompletionLogprobs | null }[];
  usage?: Usage;
  kestrel?: KestrelDetails;
}

/** What OpenAI's requests carry besides the sampling options, as the engine takes them. */
export interface RequestEnvelope {
  /** OpenAI's; any name is accepted and the engine's model answers (every OpenAI snippet passes one). */
  model?: string;
  stream?: boolean;
  /** `include_usage`: a last chunk with empty `choices` and the `usage`, after the final chunk. */
  stream_options?: { include_usage?: boolean };
}

export interface ChatCompletionRequest extends SamplingOptions, RequestEnvelope {
  messages: ChatMessage[];
  /**
   * Functions the model may call. The model's chat template shows them to it (Qwen/Hermes
   * `<tool_call>` blocks, Llama 3.1's JSON; a template that knows no tools gets them in a system
   * message); a call names one of them and its arguments validate against its `parameters`. The
   * calls come back as `message.tool_calls` / `delta.tool_calls` with finish_reason
   * "tool_calls". Not with `response_format`, `regex` or `grammar`.
   */
  tools?: Tool[];
  /** `auto` (the default with tools), `none` (the tools are not shown), `required`, or one function. */
  tool_choice?: ToolChoice;
  /** Whether one answer may make several calls (default true). */
  parallel_tool_calls?: boolean;
}

export interface CompletionRequest extends SamplingOptions, RequestEnvelope {
  prompt: string;
}

/**
 * `embeddings.create`'s argument: OpenAI's embeddings request (its `model` and `user` are
 * accepted and change nothing), Kestrel's `truncate`, and the package's `signal`. Any other field
 * is `invalid_option`.
 */
export interface EmbeddingCreateParams {
  /**
   * A text, texts (1 to 2048 per call, embedded together), or token ids of the model's
   * vocabulary (one input, or one array per input). An empty text or array is `invalid_option`.
   */
  input: string | string[] | number[] | number[][];
  /**
   * Keep the first `dimensions` values of each vector (Matryoshka truncation), normalized again:
   * 1 to the model's `info.model.dimensions`.
   */
  dimensions?: number;
  /** 'float' (the default): arrays of numbers; 'base64': each vector's little-endian f32 bytes in base64. */
  encoding_format?: 'float' | 'base64';
  /**
   * An input longer than the model's context (`info.model.context_length` tokens) is cut to it,
   * keeping its closing token; without it (false, the default) such an input is `context_overflow`.
   */
  truncate?: boolean;
  /** OpenAI's; ignored (the engine's model answers). */
  model?: string;
  /** OpenAI's; ignored. */
  user?: string;
  /**
   * Rejects the call with the signal's reason (an `AbortError` DOMException unless the page gave
   * another) as soon as it aborts; a call still waiting behind others is never run. A local
   * engine's pass over the inputs cannot be interrupted once it started: the worker finishes it
   * and drops the result, and the calls after it wait for that. A remote engine's request is cancelled.
   */
  signal?: AbortSignal;
}

/** One input's vector: unit length, `dimensions` long. */
export interface Embedding {
  object: 'embedding';
  /** The input's position in `input`. */
  index: number;
  /** The vector; with `encoding_format: 'base64'`, its little-endian f32 bytes in base64. */
  embedding: number[] | string;
}

/** `embeddings.create`'s answer: OpenAI's. */
export interface CreateEmbeddingResponse {
  object: 'list';
  /** One per input, in input order. */
  data: Embedding[];
  /** The model's name (a remote engine's: the server's). */
  model: string;
  /** The tokens of every input, the model's special tokens included. */
  usage: { prompt_tokens: number; total_tokens: number };
}

/**
 * `rerank`'s argument: the rerank request of llama.cpp's server, Jina and Cohere (`model` is
 * accepted and only echoed), and the package's `signal`. Any other field is `invalid_option`.
 */
export interface RerankParams {
  /** What the documents are scored against: a non-empty text. */
  query: string;
  /** The texts to score, 1 to 2048 per call (scored together). */
  documents: string[];
  /** Keep the `top_n` best results (a positive integer); default: all. */
  top_n?: number;
  /** Give each result its document's text (`document: { text }`); default false. */
  return_documents?: boolean;
  /** Echoed in the answer's `model`; the engine's model answers. */
  model?: string;
  /** As `EmbeddingCreateParams.signal`. */
  signal?: AbortSignal;
}

/** One document's score. */
export interface RerankResult {
  /** The document's position in `documents`. */
  index: number;
  /**
   * How relevant the document is to the query: a probability in [0, 1], the sigmoid of the
   * classifier head's logit, as node-llama-cpp's `rankAll` gives it (llama.cpp's server returns
   * the raw logit instead; the order is the same).
   */
  relevance_score: number;
  /** With `return_documents`: the document's text. */
  document?: { text: string };
}

/** `rerank`'s answer: llama.cpp server's, Jina's and Cohere's shape. */
export interface RerankResponse {
  /** The request's `model` where it gave one, else the model's name (a remote engine's: the server's). */
  model: string;
  object: 'list';
  /** Best first (ties keep the documents' order), at most `top_n`. */
  results: RerankResult[];
  /** The tokens of every query-document pair, the model's special tokens included. */
  usage: { prompt_tokens: number; total_tokens: number };
}

export interface Engine {
  /** Set once the model is loaded. */
  info: EngineInfo;
  /**
   * Rerankers (`info.kind` 'reranker'), on the GPU or the CPU backend, and remote engines (the server's
   * `/v1/rerank`): each document scored against the query, best first. A chat model or an
   * embedding model refuses with `invalid_option`, as a reranker refuses `embeddings.create`. A
   * bad field is `invalid_option`; a query-document pair longer than the model's context is
   * `context_overflow`. Queued and aborted as `embeddings.create`.
   */
  rerank(request: RerankParams): Promise<RerankResponse>;
  /**
   * Embedding models (`info.kind` 'embedding'), on the GPU or the CPU backend, and remote engines (the
   * server's `/v1/embeddings`). A chat model refuses with `invalid_option`, as an embedding model
   * refuses `chat.completions` and `completions`. A bad input is `invalid_option`; an input
   * longer than the model's context, without `truncate`, is `context_overflow`.
   */
  embeddings: {
    create(request: EmbeddingCreateParams & { encoding_format: 'base64' }): Promise<CreateEmbeddingResponse & { data: (Embedding & { embedding: string })[] }>;
    create(request: EmbeddingCreateParams & { encoding_format?: 'float' }): Promise<CreateEmbeddingResponse & { data: (Embedding & { embedding: number[] })[] }>;
    create(request: EmbeddingCreateParams): Promise<CreateEmbeddingResponse>;
  };
  chat: {
    completions: {
      create(request: ChatCompletionRequest & { stream: true }): Promise<AsyncIterable<ChatCompletionChunk>>;
      create(request: ChatCompletionRequest & { stream?: false }): Promise<ChatCompletion>;
      /** `stream` known only at run time: narrow the result with `Symbol.asyncIterator in result`. */
      create(request: ChatCompletionRequest): Promise<AsyncIterable<ChatCompletionChunk> | ChatCompletion>;
    };
  };
  completions: {
    create(request: CompletionRequest & { stream: true }): Promise<AsyncIterable<Completion>>;
    create(request: CompletionRequest & { stream?: false }): Promise<Completion>;
    /** `stream` known only at run time: narrow the result with `Symbol.asyncIterator in result`. */
    create(request: CompletionRequest): Promise<AsyncIterable<Completion> | Completion>;
  };
  /** Forgets the conversation cached on the GPU (saved `persistPrefix` entries stay: `clearSavedPrefixes()`). */
  reset(): Promise<void>;
  /** What the engine holds now (answered after the requests queued before it). */
  memory(): Promise<EngineMemory>;
  /**
   * Resolves once the work after the requests before it has ended: with `persistPrefix`, the KV
   * prefix of the last request written to storage (it is saved after the answer, so a page that
   * reloads at once should await this first).
   */
  flush(): Promise<void>;
  /** Frees the model's GPU memory and stops the worker. */
  unload(): Promise<void>;
}

/** Memory held by the engine's worker, to watch for leaks. */
export interface EngineMemory {
  /** Size of the wasm instance's memory (it grows, never shrinks). */
  wasm_bytes: number;
  /** GPU buffers created and neither destroyed nor yet garbage-collected (dropped ones wait for the collector). */
  gpu_buffers: number;
  gpu_buffer_bytes: number;
}

/** A model file: its URL, a File or a Blob; a split model's first shard's URL or its shards. */
export type ModelSource = string | URL | Blob | Blob[] | FileList;

export interface CreateEngineOptions {
  /**
   * A URL (fetched, then kept in the Cache API), a File or a Blob of a GGUF file. A split model
   * (llama.cpp's gguf-split, `kestrel split`): its first shard's URL (`…-00001-of-00003.gguf`,
   * which brings the others), or its shards as Files or Blobs (an array or a FileList; Files
   * are taken in the order of their names).
   */
  model: ModelSource;
  onProgress?: (progress: LoadProgress) => void;
  /**
   * The file's SHA-256 (hex), checked as it streams in: a mismatch is `bad_model` and the copy is
   * not cached. A split model's: one per shard, in order.
   */
  sha256?: string | string[];
  /** Follows the engine recovering by itself from a lost GPU device or a crash (see EngineStatus). */
  onStatus?: (status: EngineStatus) => void;
  /**
   * Where the model runs: 'webgpu', 'cpu' (wasm SIMD kernels in the engine's worker), or 'auto'
   * (the default): the GPU unless there is no WebGPU, its adapter is a software rasterizer
   * (SwiftShader, llvmpipe, WARP), or the model does not fit it; then the CPU.
   */
  backend?: 'webgpu' | 'cpu' | 'auto';
  /** Force optional GPU features off (all default to true: used where the adapter has them). */
  gpu?: { allow_f16?: boolean; allow_subgroups?: boolean; allow_timestamps?: boolean };
  /** KV cache length in tokens (default: the model's training context, at most 4096). */
  context_length?: number;
  /**
   * How the KV cache stores keys and values: 'f16' (the default; half the memory and half the
   * attention's reads, as llama.cpp's default) or 'f32'.
   */
  kv_cache?: 'f16' | 'f32';
  /**
   * How many requests run at once as one batch (1 to 16, default 1), each with its own KV cache
   * of `context_length` tokens: concurrent `create()` calls share each pass of the model instead
   * of waiting in turn, and each gives the tokens it gives alone.
   */
  slots?: number;
  /**
   * Prompt tokens a batched step runs at most, over all prompts being admitted (1 to 4096,
   * default 32): what a new prompt may add to the running requests' time between tokens.
   */
  prefill_chunk?: number;
  /**
   * The GPU time in ms one submission of a prompt may take (at most 1000): a prompt chunk goes to
   * the GPU in pieces of whole layers, each after the previous one finished, so that the browser
   * (whose GPU process also draws the page) draws frames between them. Default: half the
   * display's frame interval, measured as the engine's worker starts; 0: a whole chunk at once.
   */
  submit_budget_ms?: number;
  /**
   * Keep the conversation's KV cache across page loads: after each request its rows are saved in
   * the Origin Private File System (keyed by the model file's sha256 and the token ids; the file is
   * hashed as it loads), and a later request whose prompt starts with saved tokens prefills only
   * the rest (`usage.extra.reused_tokens`). `maxBytes` bounds the saved rows of every model
   * together (default 256 MiB; the least recently written go first; a conversation longer than
   * that keeps its first tokens). A corrupt saved entry is deleted, one of another model file or
   * cache setup is left for it; neither is used. `clearSavedPrefixes()` deletes them all.
   */
  persistPrefix?: boolean | { maxBytes?: number };
  /**
   * One engine for every tab of this origin that loads the same model URL with the same options:
   * the model loads once (in GPU memory once) and the tabs' requests run together, as one batch
   * with `slots` above 1 or on the CPU backend. It runs in a SharedWorker, or where the browser
   * has none (Chrome on Android) in the worker of a tab elected with Web Locks, the others talking
   * to it over a BroadcastChannel. A tab that closes or navigates ends only its own requests;
   * when the leading tab closes, the next one takes over (loading the model from the Cache API)
   * and the requests in flight fail with `leader_lost`, which a retry answers. `engine.unload()`
   * leaves the shared engine; the last tab to leave frees it. Needs a URL model, and not with
   * `persistPrefix`. `engine.info.shared` says how the tab reaches it and how many tabs use it.
   */
  shared?: boolean;
  /**
   * Speculative decoding: each step of the model checks a draft of the tokens that may follow
   * and keeps those it would have generated itself, several tokens for one pass over the weights
   * (greedy requests give the very tokens they give without; sampled ones the same distribution).
   * `lookup: true` drafts from the prompt and the output so far (no second model; pays where the
   * answer repeats its prompt: edits, quotes, extraction); `draftModel` drafts with a smaller model.
   * `maxDraft`: the most tokens per draft (1 to 16, default 16). On both backends; on WebGPU the
   * verification's kernels round differently from the decode kernels', so a greedy answer may
   * part from the plain one where two tokens are within 0.02 of each other. A request's
   * `speculative: false` decodes without it; `kestrel.speculative` reports what it drafted and kept.
   */
  speculative?: { lookup?: boolean; maxDraft?: number };
  /**
   * A smaller model with the same vocabulary (a URL, a File or a Blob, as `model`) that drafts
   * tokens for speculative decoding, loaded after the model onto the CPU backend whichever backend
   * the model runs on. The CPU backend's fit check counts it (`Estimate.cpu.draft_bytes`); a model
   * on WebGPU is checked against the GPU alone. A model of another vocabulary fails the load with
   * `invalid_option`.
   */
  draftModel?: ModelSource;
  /**
   * An OpenAI-compatible server (kestrel serve, llama-server, vLLM) to send the same requests to
   * when the model cannot run here: with backend 'webgpu', where this browser has no WebGPU or
   * the model does not fit its GPU (with 'auto' the CPU path runs it instead). Without it the
   * package makes no request but the model's and its own files.
   */
  remote?: RemoteOptions;
}

/**
 * When the GPU device is lost (driver reset, the browser reclaiming the GPU), the request in flight
 * fails with `device_lost` and the engine recovers by itself: 'device_lost', then 'reloading' (a
 * new device, the model from the Cache API or the same File), then 'ready', or 'failed' with the
 * error (the engine is then unusable). Requests made meanwhile wait for it.
 *
 * A shared engine (`shared: true`) whose leading tab closed: the requests in flight fail with
 * `leader_lost`, then 'leader_lost', 'reloading' (the next tab in line loads the model from the
 * Cache API), then 'ready' or 'failed', in every tab that used it.
 *
 * When the engine crashes (a bug: its WebAssembly traps on a Rust panic, a stack overflow or an
 * allocation failure, and its state is lost), the request that crashed it and those in flight fail
 * with `internal` (the message says what trapped), then 'crashed' with that error, 'reloading' (a
 * new worker loads the model from the Cache API or the same File), then 'ready' or 'failed'.
 * Requests made meanwhile wait for it. A crash during that reload fails it.
 */
export interface EngineStatus {
  status: 'device_lost' | 'leader_lost' | 'crashed' | 'reloading' | 'ready' | 'failed';
  error?: { code: string; message: string };
}

export interface RemoteOptions {
  /** The API's base URL, e.g. `http://127.0.0.1:8080/v1` (the server must allow the page's origin: `kestrel serve --cors-origin`). */
  baseURL: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** The `model` field of the requests (default 'kestrel'). */
  model?: string;
}

/** The memory a model's buffers must fit in, and where that number comes from. */
export interface MemoryLimit {
  bytes: number;
  /**
   * 'device_memory': the host memory the browser reports (`navigator.deviceMemory`), where it is
   * below Chrome's cap of 8 GiB; 'default': 16 GiB, the VRAM of high-end consumer GPUs, where the
   * browser reports the cap or nothing (WebGPU reports no memory size); 'wasm32': the 4 GiB that
   * 32-bit wasm memory can grow to (the CPU backend's).
   */
  source: 'device_memory' | 'default' | 'wasm32';
}

/** Will a model fit, from its GGUF header alone (see `estimate`). */
export interface Estimate {
  /**
   * 'chat', 'embedding' or 'reranker' (an encoder with rank pooling). An encoder has no KV
   * cache; on the GPU its weights and activations are its layers' and a pass's (the embedding
   * table stays with the CPU). A decoder embedding model is sized as a chat model of one slot.
   */
  kind: 'chat' | 'embedding' | 'reranker';
  /**
   * Why a GPU engine would run this model on the CPU backend (an encoder the GPU kernels cannot
   * run): then its GPU verdict (`fits`) is the CPU backend's.
   * null: it runs on the GPU.
   */
  cpu_only: string | null;
  name: string;
  arch: string;
  /** The file's size, as its header declares it. */
  file_bytes: number;
  /** The weights as packed on the GPU. */
  weight_bytes: number;
  context_length: number;
  /** Sequences that generate at once (`createEngine`'s `slots`), each with its own KV cache. */
  slots: number;
  /** K and V of every layer at `context_length` for every slot, in the cache's value type. */
  kv_cache_bytes: number;
  /** The GPU's activation buffers: a prompt chunk's, the logits', the decode attention's scratch. */
  activation_bytes: number;
  /** Weights + KV cache + activations: what the GPU must hold at once. */
  total_bytes: number;
  /** The largest buffer one binding must hold. */
  largest_binding: { name: string; bytes: number };
  /** Tensors of a type Kestrel cannot run. */
  unsupported: { tensor: string; type: string }[];
  /** The adapter's limits compared with (null without WebGPU). */
  limits: { maxBufferSize: number; maxStorageBufferBindingSize: number } | null;
  /** What a GPU here can plausibly hold, which `total_bytes` must not exceed. */
  memory_limit: MemoryLimit;
  /** Whether the GPU can load it: every binding within `limits`, `total_bytes` within `memory_limit`. */
  fits: boolean;
  /** Why not: `device_limits`, `unsupported_quant` or `no_webgpu`, with the numbers that decided it in `reason`. */
  code: 'device_limits' | 'unsupported_quant' | 'no_webgpu' | null;
  reason: string | null;
  /**
   * The CPU backend (backend 'cpu', and 'auto' where the GPU cannot run the model): the wasm memory
   * it needs, and whether that fits 32-bit wasm's 4 GiB (`memory_limit`).
   */
  cpu: {
    /** Weights + KV cache + scratch + the engine's own. */
    bytes: number;
    /** The weights as the CPU backend stores them (integers with f32 scales). */
    weight_bytes: number;
    kv_cache_bytes: number;
    /** The larger of the load's transient buffers (the largest tensor's bytes) and a step's. */
    scratch_bytes: number;
    /** The engine itself: its data and stack, the tokenizer and the header's metadata. */
    engine_bytes: number;
    /** With `draftModel`: the draft model's weights, KV cache, scratch and tokenizer (else 0). */
    draft_bytes: number;
    memory_limit: MemoryLimit;
    fits: boolean;
    /** Why not: `device_limits` or `unsupported_quant`, with the numbers in `reason`. */
    code: 'device_limits' | 'unsupported_quant' | null;
    reason: string | null;
  };
}

/**
 * Reads only the GGUF header of `model` (an HTTP range request, or the first bytes of a File) and
 * says whether it fits this browser's GPU with `slots` (default 1) `context_length`-token KV
 * caches, and whether it fits the CPU backend's wasm memory (`cpu`), with `draftModel` beside it
 * there where given.
 */
export function estimate(options: {
  model: ModelSource; context_length?: number; kv_cache?: 'f16' | 'f32'; slots?: number; draftModel?: ModelSource;
}): Promise<Estimate>;
/** Deletes every KV prefix `persistPrefix` saved in this origin's storage; true when there were any. */
export function clearSavedPrefixes(): Promise<boolean>;

/** Starts the engine's worker and loads the model; resolves when it is ready. */
export function createEngine(options: CreateEngineOptions): Promise<Engine>;
export function hasModelInCache(url: string): Promise<boolean>;
export function deleteModelFromCache(url: string): Promise<boolean>;
/** The models the Cache API holds (stored by earlier loads), with their sizes. */
export function listCachedModels(): Promise<{ url: string; bytes: number }[]>;
