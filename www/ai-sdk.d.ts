// Types of `@kestrel-llm/web/ai-sdk`: a Vercel AI SDK provider over a Kestrel engine. Its models
// implement the AI SDK's LanguageModelV4 specification (`@ai-sdk/provider` 4, used by `ai` 7),
// whose types come from `@ai-sdk/provider` (an optional peer dependency: only these declarations
// import it, the module itself imports nothing of the AI SDK).

import type { LanguageModelV4, ProviderV4 } from '@ai-sdk/provider';
import type { ChatCompletionRequest, CreateEngineOptions, Engine, Estimate, KestrelErrorCode } from './index.js';

/**
 * An existing engine, which the provider uses as it is (and never unloads by itself), or
 * `createEngine`'s options, from which the provider creates its engine on first use: the first
 * request (or `engine()`) loads the model, reporting to `onProgress`, and every model of the
 * provider shares that engine.
 */
export type KestrelProviderSettings = { engine: Engine } | CreateEngineOptions;

/**
 * Whether the provider's model can run, answered before anything downloads:
 * - `available`: an engine is loaded;
 * - `downloading`: the provider is loading it now;
 * - `downloadable`: the model fits this browser (`estimate()`, from its GGUF header alone) with
 *   the settings' backend, `context_length`, `kv_cache` and `slots`;
 * - `unavailable`: it does not fit, its header could not be read, or the given engine was
 *   unloaded; `code` and `reason` say why.
 */
export interface KestrelAvailability {
  status: 'available' | 'downloading' | 'downloadable' | 'unavailable';
  code?: KestrelErrorCode;
  reason?: string;
  /** The estimate the answer came from (`downloadable`, and `unavailable` where the header was read). */
  estimate?: Estimate;
}

/**
 * Kestrel's own request fields, given as `providerOptions: { kestrel: { ... } }` (the engine
 * checks them: an unknown field fails with `invalid_option`). A field the AI SDK call already
 * sets (such as `temperature`), or one the provider owns (`messages`, `stream`, `tools`,
 * `tool_choice`, `response_format`), fails with `invalid_option`.
 */
export type KestrelProviderOptions = Pick<
  ChatCompletionRequest,
  | 'parallel_tool_calls' | 'min_p' | 'repetition_penalty' | 'penalty_last_n' | 'logit_bias' | 'stop_token_ids'
  | 'ignore_eos' | 'logprobs' | 'top_logprobs' | 'regex' | 'grammar'
>;

/** A Kestrel model as the AI SDK calls it (`generateText`, `streamText`, `Output.object`, tools). */
export interface KestrelLanguageModel extends LanguageModelV4 {
  readonly provider: 'kestrel';
}

export interface KestrelProvider extends ProviderV4 {
  /** The provider's model; `modelId` only names it (default: the model file's name). */
  (modelId?: string): KestrelLanguageModel;
  languageModel(modelId?: string): KestrelLanguageModel;
  /** Kestrel runs chat models only: throws the AI SDK's NoSuchModelError (`NoSuchModelError.isInstance`). */
  embeddingModel(modelId: string): never;
  /** Kestrel runs chat models only: throws the AI SDK's NoSuchModelError (`NoSuchModelError.isInstance`). */
  imageModel(modelId: string): never;
  /** Whether the model can run here, before anything downloads (see KestrelAvailability). */
  availability(): Promise<KestrelAvailability>;
  /** The provider's engine: the given one, or the one it creates (loading the model on the first call). */
  engine(): Promise<Engine>;
  /**
   * Unloads the provider's engine: a created one is created again by the next request; a given
   * one is unusable after (its requests fail with `unloaded`).
   */
  unload(): Promise<void>;
}

/**
 * A Vercel AI SDK provider of Kestrel models:
 * `generateText({ model: createKestrel({ model: url })(), prompt })`. Prompt text, tool calls and
 * tool results map to Kestrel's chat messages; function tools, `toolChoice`, JSON output
 * (`Output.object`), the sampling settings and `abortSignal` to its request. Settings Kestrel
 * lacks (file parts, reasoning, provider tools) come back as the call's `warnings`. Bad settings
 * throw KestrelError `invalid_option`.
 */
export function createKestrel(settings: KestrelProviderSettings): KestrelProvider;
