// Types of `@kestrel-llm/web/prompt-api`: Chrome's Prompt API (`LanguageModel`) over a Kestrel engine.
// The shapes follow the Prompt API's IDL (https://webmachinelearning.github.io/prompt-api/).

import type { CreateEngineOptions, Engine } from './index.d.ts';

/** Whether a model with the given options can be used: at once, after a download, or not at all. */
export type Availability = 'unavailable' | 'downloadable' | 'downloading' | 'available';

export type LanguageModelMessageRole = 'system' | 'user' | 'assistant';
export type LanguageModelMessageType = 'text' | 'image' | 'audio' | 'tool-call' | 'tool-response';

/** One part of a message: only `text` is supported (others reject with `NotSupportedError`). */
export interface LanguageModelMessageContent {
  type: LanguageModelMessageType;
  value: unknown;
}

export interface LanguageModelMessage {
  role: LanguageModelMessageRole;
  /** A string is shorthand for `[{ type: 'text', value }]`. */
  content: string | LanguageModelMessageContent[];
  /** An assistant prefix to continue: rejects with `NotSupportedError` (the engine cannot prefill an answer). */
  prefix?: boolean;
}

/** A string is shorthand for `[{ role: 'user', content: string }]`. */
export type LanguageModelPrompt = string | LanguageModelMessage[];

export interface LanguageModelExpected {
  type: LanguageModelMessageType;
  /** BCP 47 tags; validated, not checked against the model (whose languages Kestrel cannot know). */
  languages?: string[];
}

export interface LanguageModelCreateCoreOptions {
  /** Sampling from the `topK` most likely tokens (1 is greedy); at most `maxTopK`, floored. */
  topK?: number;
  /** Sampling temperature (0 is greedy); at most `maxTemperature`. */
  temperature?: number;
  /** Only 'balanced' (the default) is supported; others reject with `NotSupportedError`. */
  samplingMode?: 'most-predictable' | 'predictable' | 'balanced' | 'creative' | 'most-creative' | (string & {});
  /** Only `{ type: 'text' }` inputs are supported. */
  expectedInputs?: LanguageModelExpected[];
  /** Only `{ type: 'text' }` outputs are supported. */
  expectedOutputs?: LanguageModelExpected[];
  /** Tool use is not supported: a non-empty list rejects with `NotSupportedError`. */
  tools?: unknown[];
}

/** Where `create()` reports the model's load: `downloadprogress` events, `loaded` from 0 to 1. */
export interface CreateMonitor extends EventTarget {
  ondownloadprogress: ((this: CreateMonitor, event: ProgressEvent) => void) | null;
}

export interface LanguageModelCreateOptions extends LanguageModelCreateCoreOptions {
  /** Aborts the creation; aborting it later destroys the session. */
  signal?: AbortSignal;
  monitor?: (monitor: CreateMonitor) => void;
  /** Messages the session starts with (a system message only first); never evicted on overflow. */
  initialPrompts?: LanguageModelMessage[];
}

export interface LanguageModelPromptOptions {
  /** A JSON Schema (Kestrel's `response_format` json_schema) or a RegExp (Kestrel's `regex`) the answer must match. */
  responseConstraint?: Record<string, unknown> | RegExp;
  /** Leave out the message that shows the constraint to the model (which uses context). */
  omitResponseConstraintInput?: boolean;
  signal?: AbortSignal;
}

export interface LanguageModelAppendOptions {
  signal?: AbortSignal;
}

export interface LanguageModelCloneOptions {
  signal?: AbortSignal;
}

export interface LanguageModelParams {
  defaultTopK: number;
  maxTopK: number;
  defaultTemperature: number;
  maxTemperature: number;
}

/** A session: a conversation with the model, as Chrome's `LanguageModel` instances. */
export interface LanguageModel extends EventTarget {
  /** The answer to `input` after the conversation so far; both join the conversation. */
  prompt(input: LanguageModelPrompt, options?: LanguageModelPromptOptions): Promise<string>;
  /** The answer as it is generated: each chunk is the text new since the previous one. */
  promptStreaming(input: LanguageModelPrompt, options?: LanguageModelPromptOptions): ReadableStream<string> & AsyncIterable<string>;
  /** Adds `input` to the conversation (read by the model now) without an answer. */
  append(input: LanguageModelPrompt, options?: LanguageModelAppendOptions): Promise<void>;
  /** Tokens `input` would add to `contextUsage` (counted by the engine's tokenizer and chat template). */
  measureContextUsage(input: LanguageModelPrompt, options?: LanguageModelPromptOptions): Promise<number>;
  /** The tokens the conversation holds, as the engine counted them in its last request. */
  readonly contextUsage: number;
  /** The engine's context length in tokens. */
  readonly contextWindow: number;
  /** Fired when the oldest turns after the initial prompts were dropped for a new one to fit. */
  oncontextoverflow: ((this: LanguageModel, event: Event) => void) | null;
  /** The older names of `measureContextUsage`, `contextUsage`, `contextWindow` and `oncontextoverflow`. */
  measureInputUsage(input: LanguageModelPrompt, options?: LanguageModelPromptOptions): Promise<number>;
  readonly inputUsage: number;
  readonly inputQuota: number;
  onquotaoverflow: ((this: LanguageModel, event: Event) => void) | null;
  readonly topK: number;
  readonly temperature: number;
  /** A session with the same conversation and options, independent from then on. */
  clone(options?: LanguageModelCloneOptions): Promise<LanguageModel>;
  /** Aborts what runs; later calls reject with an `InvalidStateError` DOMException. */
  destroy(): void;
}

/** The static side of `LanguageModel`: what `globalThis.LanguageModel` is in Chrome. */
export interface LanguageModelConstructor {
  readonly prototype: LanguageModel;
  create(options?: LanguageModelCreateOptions): Promise<LanguageModel>;
  availability(options?: LanguageModelCreateCoreOptions): Promise<Availability>;
  params(): Promise<LanguageModelParams | null>;
}

/** Options of the adapter itself, next to the engine or createEngine's options. */
export interface KestrelLanguageModelOptions {
  /** Most tokens an answer may have (default: until the model stops or the context is full). */
  maxTokens?: number;
}

/** A loaded engine, or createEngine's options (the engine then loads on the first `create()`). */
export type LanguageModelSource = ({ engine: Engine } | CreateEngineOptions) & KestrelLanguageModelOptions;

/** A `LanguageModel` over a Kestrel engine. */
export function createLanguageModel(source: LanguageModelSource): LanguageModelConstructor;

/**
 * Sets `globalThis.LanguageModel` to `createLanguageModel(source)` where the browser has none, or
 * has one whose `availability()` says 'unavailable'; resolves to the `LanguageModel` in use (the
 * browser's own where it can run).
 */
export function installLanguageModel(source: LanguageModelSource): Promise<LanguageModelConstructor>;
