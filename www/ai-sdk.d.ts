// Types of `@kestrel-llm/web/ai-sdk`: a Vercel AI SDK provider over a Kestrel engine, for `ai`
// 5, 6 and 7 (an optional peer dependency). Its models implement the specification the installed
// `ai` calls, LanguageModelV2 (ai 5), V3 (ai 6) or V4 (ai 7), as the module picks at run time from
// `ai`'s version; these declarations take that specification's types from `ai` itself (its
// `LanguageModel`), so they follow whichever `ai` the app has.

import type { LanguageModel } from 'ai';
import type { ChatCompletionRequest, CreateEngineOptions, Engine, Estimate, KestrelErrorCode } from './index.js';

/** The models the installed `ai` takes: its `LanguageModel`, less the ids of a global provider's. */
type AiLanguageModel = Exclude<LanguageModel, string>;

/** The newest specification of `Model`'s: what `ai` calls natively (it takes older ones in a compatibility mode). */
type NewestModel<Model> = [Extract<Model, { specificationVersion: 'v4' }>] extends [never]
  ? [Extract<Model, { specificationVersion: 'v3' }>] extends [never]
    ? Extract<Model, { specificationVersion: 'v2' }>
    : Extract<Model, { specificationVersion: 'v3' }>
  : Extract<Model, { specificationVersion: 'v4' }>;

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

/**
 * A Kestrel model as the AI SDK calls it (`generateText`, `streamText`, `generateObject`,
 * `Output.object`, tools): a LanguageModelV2 with `ai` 5, V3 with `ai` 6, V4 with `ai` 7.
 */
export type KestrelLanguageModel = NewestModel<AiLanguageModel> & { readonly provider: 'kestrel' };

/** The specification of the provider's models: 'v2' (ai 5), 'v3' (ai 6) or 'v4' (ai 7). */
export type KestrelSpecificationVersion = KestrelLanguageModel['specificationVersion'];

/**
 * The provider: a ProviderV2, V3 or V4, as its models are (ProviderV3 and V4 name their
 * `specificationVersion`; ProviderV2 has none).
 */
export type KestrelProvider = KestrelProviderMethods &
  (KestrelSpecificationVersion extends 'v2' ? {} : { readonly specificationVersion: KestrelSpecificationVersion });

export interface KestrelProviderMethods {
  /** The provider's model; `modelId` only names it (default: the model file's name). */
  (modelId?: string): KestrelLanguageModel;
  languageModel(modelId?: string): KestrelLanguageModel;
  /** Kestrel runs chat models only: throws the AI SDK's NoSuchModelError (`NoSuchModelError.isInstance`). */
  embeddingModel(modelId: string): never;
  /** ProviderV2's (ai 5's) name of `embeddingModel`: throws the AI SDK's NoSuchModelError. */
  textEmbeddingModel(modelId: string): never;
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
 * (`generateObject`, `Output.object`), the sampling settings and `abortSignal` to its request.
 * Settings Kestrel lacks (file parts, reasoning, provider tools) come back as the call's
 * `warnings`. Bad settings throw KestrelError `invalid_option`, and so does an installed `ai`
 * other than 5, 6 or 7 (the message names its version and the supported ones).
 */
export function createKestrel(settings: KestrelProviderSettings): KestrelProvider;
