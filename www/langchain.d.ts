// Types of `@kestrel-llm/web/langchain`: a LangChain.js chat model over a Kestrel engine
// (needs `@langchain/core` >=1 <2, the package's optional peer dependency).

import type { CallbackManagerForLLMRun } from '@langchain/core/callbacks/manager';
import type { BaseLanguageModelInput, StructuredOutputMethodOptions } from '@langchain/core/language_models/base';
import type { BaseChatModel, BaseChatModelCallOptions, BaseChatModelParams, BindToolsInput } from '@langchain/core/language_models/chat_models';
import type { AIMessageChunk, BaseMessage } from '@langchain/core/messages';
import type { ChatGenerationChunk, ChatResult } from '@langchain/core/outputs';
import type { Runnable } from '@langchain/core/runnables';
import type { SerializableSchema } from '@langchain/core/utils/standard_schema';
import type { InteropZodType } from '@langchain/core/utils/types';
import type { ChatCompletionRequest, CreateEngineOptions, Engine, ResponseFormat, Tool } from './index.d.ts';

/** Sampling, in LangChain's names (Kestrel's: temperature, max_tokens, top_p, top_k, seed, stop); unset ones take Kestrel's defaults. */
export interface KestrelSamplingParams {
  /** 0 is greedy. */
  temperature?: number;
  /** Most tokens to generate. */
  maxTokens?: number;
  topP?: number;
  /** 0 disables it. */
  topK?: number;
  /** Same seed, same tokens. */
  seed?: number;
  /** Stop when the text contains one of these. */
  stop?: string[];
}

/** Per-call options: LangChain's (`signal`, `tool_choice`, callbacks, ...), sampling, and what bindTools and withStructuredOutput bind. */
export interface ChatKestrelCallOptions extends BaseChatModelCallOptions, KestrelSamplingParams {
  /** Tools the model may call: LangChain tools, `{ name, description, schema }` (zod or JSON Schema), or OpenAI's function tools. */
  tools?: BindToolsInput[];
  /**
   * 'auto', 'any' (some tool must be called: Kestrel's 'required'), 'none', a tool's name, or
   * OpenAI's `{ type: 'function', function: { name } }`.
   */
  tool_choice?: BaseChatModelCallOptions['tool_choice'];
  /** Whether one answer may make several calls (Kestrel's default: true). */
  parallel_tool_calls?: boolean;
  /** Kestrel's (OpenAI's) structured output: JSON, or JSON valid against a schema. */
  response_format?: ResponseFormat;
}

/**
 * `{ engine }`: an engine of createEngine (the caller unloads it); or createEngine's options
 * (`model`, `backend`, `context_length`, ...): the model creates its engine on its first call.
 */
export type ChatKestrelInput = BaseChatModelParams & KestrelSamplingParams & (
  | { engine: Engine | Promise<Engine>; model?: never }
  | (CreateEngineOptions & { engine?: never })
);

/** The request a call sends, less its messages (engine.chat.completions.create's fields). */
export type KestrelInvocationParams = Omit<ChatCompletionRequest, 'messages' | 'stream' | 'signal'>;

/**
 * LangChain's chat model on Kestrel: system, human, AI (with tool_calls), tool and chat messages;
 * `invoke` and `stream` (AIMessageChunks per delta, `handleLLMNewToken` per text), with
 * `usage_metadata` and `response_metadata.finish_reason`; `signal` aborts the generation (the
 * call rejects with LangChain's ModelAbortError); `bindTools`; `withStructuredOutput`.
 * Bad input rejects with a KestrelError of code `invalid_option`.
 */
/** The model's own sampling settings, over which each call's options go. */
export interface ChatKestrel extends KestrelSamplingParams {}

export declare class ChatKestrel extends BaseChatModel<ChatKestrelCallOptions, AIMessageChunk> {
  static lc_name(): string;
  constructor(fields: ChatKestrelInput);
  /**
   * The engine: the one given, else the one created from the options (loaded once; a failed
   * load is retried by the next call). Unload it with `(await model.getEngine()).unload()`.
   */
  getEngine(): Promise<Engine>;
  _llmType(): string;
  /** The request's parameters besides its messages: the call's options over the model's. */
  invocationParams(options?: Partial<ChatKestrelCallOptions>): KestrelInvocationParams;
  _generate(messages: BaseMessage[], options: this['ParsedCallOptions'], runManager?: CallbackManagerForLLMRun): Promise<ChatResult>;
  _streamResponseChunks(messages: BaseMessage[], options: this['ParsedCallOptions'], runManager?: CallbackManagerForLLMRun): AsyncGenerator<ChatGenerationChunk>;
  /**
   * Binds tools as Kestrel's function tools (converted with convertToOpenAITool); `kwargs` are
   * call options, e.g. `{ tool_choice: 'get_weather' }`. The AI messages then carry `tool_calls`
   * (streamed: `tool_call_chunks`).
   */
  bindTools(tools: BindToolsInput[], kwargs?: Partial<ChatKestrelCallOptions>): Runnable<BaseLanguageModelInput, AIMessageChunk, ChatKestrelCallOptions>;
  /**
   * The answer as an object of `schema` (zod, a standard schema, or JSON Schema). `method`:
   * 'jsonSchema' (the default: Kestrel's `response_format` json_schema constrains the answer),
   * 'functionCalling' (a forced call of a tool with the schema as parameters), or 'jsonMode'
   * (`response_format` json_object; the schema only validates). A zod or standard schema
   * validates the result (an invalid one rejects with LangChain's OutputParserException).
   */
  withStructuredOutput<RunOutput extends Record<string, any> = Record<string, any>>(
    schema: InteropZodType<RunOutput> | SerializableSchema<RunOutput> | Record<string, any>,
    config?: StructuredOutputMethodOptions<false>,
  ): Runnable<BaseLanguageModelInput, RunOutput>;
  withStructuredOutput<RunOutput extends Record<string, any> = Record<string, any>>(
    schema: InteropZodType<RunOutput> | SerializableSchema<RunOutput> | Record<string, any>,
    config?: StructuredOutputMethodOptions<true>,
  ): Runnable<BaseLanguageModelInput, { raw: BaseMessage; parsed: RunOutput }>;
}
