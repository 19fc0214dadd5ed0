// A LangChain.js chat model over a Kestrel engine (`@kestrel-llm/web/langchain`): LangChain's
// messages, tools and structured output mapped onto engine.chat.completions.create. Its runtime
// imports are `@langchain/core` subpaths (an optional peer dependency) and the package's own
// errors.js; index.js is imported only when the model has to create its engine itself, so a page
// that passes an engine does not load it twice.

// Typed by langchain.d.ts (the declared API); checked with `tsc --checkJs`.
/**
 * @import { BaseMessage, InvalidToolCall, MessageContent, ToolCall as LangChainToolCall, ToolCallChunk, UsageMetadata } from '@langchain/core/messages'
 * @import { CallbackManagerForLLMRun } from '@langchain/core/callbacks/manager'
 * @import { ChatResult } from '@langchain/core/outputs'
 * @import { BindToolsInput } from '@langchain/core/language_models/chat_models'
 * @import { BaseLanguageModelInput } from '@langchain/core/language_models/base'
 * @import { Runnable } from '@langchain/core/runnables'
 * @import { ChatCompletionRequest, ChatMessage, Engine, Tool, ToolCall, ToolChoice, Usage } from './index.d.ts'
 * @import { ChatKestrelCallOptions, ChatKestrelInput, KestrelInvocationParams } from './langchain.d.ts'
 */

import { ModelAbortError } from '@langchain/core/errors';
import { BaseChatModel } from '@langchain/core/language_models/chat_models';
import { assembleStructuredOutputPipeline, createContentParser, createFunctionCallingParser } from '@langchain/core/language_models/structured_output';
import { AIMessage, AIMessageChunk } from '@langchain/core/messages';
import { ChatGenerationChunk } from '@langchain/core/outputs';
import { convertToOpenAITool } from '@langchain/core/utils/function_calling';
import { toJsonSchema } from '@langchain/core/utils/json_schema';
import { isSerializableSchema } from '@langchain/core/utils/standard_schema';
import { getSchemaDescription, isInteropZodSchema } from '@langchain/core/utils/types';
import { kestrelError } from './errors.js';
import { lazyEngine } from './lazy-engine.js';

/** The base chat model's own constructor fields: everything else but the sampling ones is createEngine's. */
const BASE_FIELDS = ['callbacks', 'callbackManager', 'verbose', 'tags', 'metadata', 'maxRetries', 'maxConcurrency', 'onFailedAttempt', 'cache', 'disableStreaming', 'outputVersion'];

/**
 * LangChain's chat model on Kestrel: `new ChatKestrel({ engine })` with an engine of createEngine,
 * or `new ChatKestrel({ model, backend, ... })` with createEngine's options (the engine then loads
 * on the first call). Sampling: `temperature`, `maxTokens`, `topP`, `topK`, `seed`, `stop`, here
 * or per call.
 * @extends {BaseChatModel<ChatKestrelCallOptions, AIMessageChunk>}
 */
export class ChatKestrel extends BaseChatModel {
  static lc_name() {
    return 'ChatKestrel';
  }

  /** @type {ReturnType<typeof lazyEngine>} */
  #engine;

  /** @param {ChatKestrelInput} fields */
  constructor(fields) {
    super(fields ?? {});
    const { temperature, maxTokens, topP, topK, seed, stop, ...rest } = /** @type {ChatKestrelInput & Record<string, unknown>} */ (fields ?? {});
    // The base chat model's own fields are LangChain's; the rest name the engine.
    this.#engine = lazyEngine(Object.fromEntries(Object.entries(rest).filter(([key]) => !BASE_FIELDS.includes(key))));
    /** @type {number | undefined} */
    this.temperature = temperature;
    /** @type {number | undefined} */
    this.maxTokens = maxTokens;
    /** @type {number | undefined} */
    this.topP = topP;
    /** @type {number | undefined} */
    this.topK = topK;
    /** @type {number | undefined} */
    this.seed = seed;
    /** @type {string[] | undefined} */
    this.stop = stop;
  }

  /**
   * The engine: the one given, else the one created from the options (loaded once; a failed load
   * is retried by the next call). Unload it with `(await model.getEngine()).unload()`.
   * @returns {Promise<Engine>}
   */
  getEngine() {
    return this.#engine.load();
  }

  _llmType() {
    return 'kestrel';
  }

  /**
   * The request's parameters besides its messages: the call's options over the model's.
   * @param {Partial<ChatKestrelCallOptions>} [options]
   * @returns {KestrelInvocationParams}
   */
  invocationParams(options) {
    /** @type {KestrelInvocationParams} */
    const params = {
      temperature: options?.temperature ?? this.temperature,
      max_tokens: options?.maxTokens ?? this.maxTokens,
      top_p: options?.topP ?? this.topP,
      top_k: options?.topK ?? this.topK,
      seed: options?.seed ?? this.seed,
      stop: options?.stop ?? this.stop,
      tools: options?.tools?.length ? kestrelTools(options.tools) : undefined,
      tool_choice: kestrelToolChoice(options?.tool_choice),
      parallel_tool_calls: options?.parallel_tool_calls,
      response_format: options?.response_format,
    };
    for (const key of /** @type {(keyof KestrelInvocationParams)[]} */ (Object.keys(params))) if (params[key] === undefined) delete params[key];
    return params;
  }

  /**
   * @param {BaseMessage[]} messages
   * @param {this['ParsedCallOptions']} options
   * @param {CallbackManagerForLLMRun} [_runManager]
   * @returns {Promise<ChatResult>}
   */
  async _generate(messages, options, _runManager) {
    const request = { ...this.invocationParams(options), messages: toKestrelMessages(messages) };
    const engine = await this.getEngine();
    const completion = await engine.chat.completions.create({ ...request, stream: false, signal: options.signal });
    const { message: answer, finish_reason } = completion.choices[0];
    const content = answer.content ?? '';
    const calls = fromKestrelToolCalls(answer.tool_calls);
    const response_metadata = { finish_reason, model_provider: 'kestrel', model_name: completion.model };
    if (finish_reason === 'abort') {
      throw new ModelAbortError('Kestrel: the generation was aborted', new AIMessageChunk({ id: completion.id, content, ...calls, response_metadata }));
    }
    const usage_metadata = usageMetadata(completion.usage);
    const message = new AIMessage({ id: completion.id, content, ...calls, usage_metadata, response_metadata });
    return {
      generations: [{ text: content, message, generationInfo: { finish_reason } }],
      llmOutput: { tokenUsage: { promptTokens: usage_metadata.input_tokens, completionTokens: usage_metadata.output_tokens, totalTokens: usage_metadata.total_tokens } },
    };
  }

  /**
   * One chunk per streamed delta (text or tool calls as `tool_call_chunks`), then one with the
   * usage and the finish reason.
   * @param {BaseMessage[]} messages
   * @param {this['ParsedCallOptions']} options
   * @param {CallbackManagerForLLMRun} [runManager]
   * @returns {AsyncGenerator<ChatGenerationChunk>}
   */
  async *_streamResponseChunks(messages, options, runManager) {
    const request = { ...this.invocationParams(options), messages: toKestrelMessages(messages) };
    const engine = await this.getEngine();
    const stream = await engine.chat.completions.create({ ...request, stream: true, signal: options.signal });
    /** @type {AIMessageChunk | null} */
    let partial = null;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      const delta = choice?.delta ?? {};
      const text = delta.content ?? '';
      if (text || delta.tool_calls?.length) {
        /** @type {ToolCallChunk[] | undefined} */
        const tool_call_chunks = delta.tool_calls?.map((call) => ({
          type: 'tool_call_chunk', id: call.id, name: call.function.name, args: call.function.arguments, index: call.index,
        }));
        const message = new AIMessageChunk({ id: chunk.id, content: text, ...(tool_call_chunks ? { tool_call_chunks } : {}) });
        partial = partial ? partial.concat(message) : message;
        const generation = new ChatGenerationChunk({ text, message });
        yield generation;
        await runManager?.handleLLMNewToken(text, { prompt: 0, completion: 0 }, undefined, undefined, undefined, { chunk: generation });
      }
      const finish_reason = choice?.finish_reason;
      if (finish_reason === 'abort') throw new ModelAbortError('Kestrel: the generation was aborted', partial ?? undefined);
      if (finish_reason) {
        const response_metadata = { finish_reason, model_provider: 'kestrel', model_name: chunk.model };
        const message = new AIMessageChunk({
          id: chunk.id, content: '', response_metadata, ...(chunk.usage ? { usage_metadata: usageMetadata(chunk.usage) } : {}),
        });
        yield new ChatGenerationChunk({ text: '', message, generationInfo: { finish_reason } });
      }
    }
  }

  /**
   * Binds tools (LangChain tools, `{ name, description, schema }` with a zod or JSON schema, or
   * OpenAI's `{ type: 'function', function }`) as Kestrel's function tools; `kwargs` are call
   * options (`tool_choice`: 'auto', 'any', 'none', a tool's name, or OpenAI's form).
   * @param {BindToolsInput[]} tools
   * @param {Partial<ChatKestrelCallOptions>} [kwargs]
   * @returns {Runnable<BaseLanguageModelInput, AIMessageChunk, ChatKestrelCallOptions>}
   */
  bindTools(tools, kwargs) {
    kestrelToolChoice(kwargs?.tool_choice);
    return this.withConfig({ tools: kestrelTools(tools), ...kwargs });
  }

  /**
   * Structured output: by default (method 'jsonSchema') the answer is constrained to the schema
   * by Kestrel's `response_format` json_schema; 'functionCalling' forces a call of a tool whose
   * parameters are the schema; 'jsonMode' constrains it to some JSON object. A zod or standard
   * schema validates the result; a plain JSON Schema only shapes it.
   * @param {any} outputSchema a zod schema, a standard (JSON-serializable) schema or a JSON Schema
   * @param {{ name?: string, method?: string, includeRaw?: boolean, strict?: boolean }} [config]
   * @returns {any}
   */
  withStructuredOutput(outputSchema, config) {
    const method = config?.method ?? 'jsonSchema';
    const name = config?.name ?? 'extract';
    const description = getSchemaDescription(outputSchema);
    const schema = isInteropZodSchema(outputSchema) || isSerializableSchema(outputSchema) ? toJsonSchema(outputSchema) : outputSchema;
    const strict = config?.strict;
    /** @type {Runnable<BaseLanguageModelInput, any>} */
    let llm;
    /** @type {Runnable<any, any>} */
    let parser;
    if (method === 'jsonSchema') {
      llm = this.withConfig({
        response_format: { type: 'json_schema', json_schema: { name, schema, ...(description ? { description } : {}), ...(strict != null ? { strict } : {}) } },
      });
      parser = createContentParser(outputSchema);
    } else if (method === 'jsonMode') {
      llm = this.withConfig({ response_format: { type: 'json_object' } });
      parser = createContentParser(outputSchema);
    } else if (method === 'functionCalling') {
      /** @type {Tool} */
      const tool = { type: 'function', function: { name, parameters: schema, ...(description ? { description } : {}), ...(strict != null ? { strict } : {}) } };
      llm = this.bindTools([tool], { tool_choice: name, parallel_tool_calls: false });
      parser = createFunctionCallingParser(outputSchema, name);
    } else {
      throw kestrelError('invalid_option', `ChatKestrel.withStructuredOutput: unknown method ${JSON.stringify(method)} (jsonSchema, functionCalling or jsonMode)`);
    }
    return assembleStructuredOutputPipeline(llm, parser, config?.includeRaw, config?.includeRaw ? 'StructuredOutputRunnable' : 'StructuredOutput');
  }
}

/**
 * LangChain's tools as Kestrel's function tools (convertToOpenAITool turns LangChain tools and
 * `{ name, description, schema }` into OpenAI's form and leaves that form as it is).
 * @param {BindToolsInput[]} tools
 * @returns {Tool[]}
 */
function kestrelTools(tools) {
  if (!Array.isArray(tools)) throw kestrelError('invalid_option', 'ChatKestrel: tools must be a list');
  return tools.map((tool, i) => {
    const converted = /** @type {Tool} */ (convertToOpenAITool(tool));
    if (converted?.type !== 'function' || typeof converted.function?.name !== 'string') {
      throw kestrelError('invalid_option', `ChatKestrel: tools[${i}] is neither a LangChain tool, { name, description, schema }, nor an OpenAI function tool { type: 'function', function: { name, parameters } }`);
    }
    return converted;
  });
}

/**
 * LangChain's tool_choice as OpenAI's: 'any' is 'required', another string names the tool.
 * @param {ChatKestrelCallOptions['tool_choice']} choice
 * @returns {ToolChoice | undefined}
 */
function kestrelToolChoice(choice) {
  if (choice == null) return undefined;
  if (choice === 'any') return 'required';
  if (choice === 'auto' || choice === 'none' || choice === 'required') return choice;
  if (typeof choice === 'string') return { type: 'function', function: { name: choice } };
  if (choice.type === 'function' && typeof choice.function?.name === 'string') return /** @type {ToolChoice} */ (choice);
  throw kestrelError('invalid_option', `ChatKestrel: tool_choice ${JSON.stringify(choice)} is not 'auto', 'any', 'none', a tool's name, or { type: 'function', function: { name } }`);
}

/** Content blocks an AI message repeats from its `tool_calls`. */
const TOOL_CALL_BLOCKS = new Set(['tool_call', 'tool_call_chunk', 'tool_use']);

/**
 * A message's text: its string, or its text blocks joined (Kestrel's models read text only).
 * @param {MessageContent} content
 * @param {number} i
 * @param {boolean} ai whether an AI message, whose tool-call blocks repeat its tool_calls
 * @returns {string}
 */
function messageText(content, i, ai) {
  if (typeof content === 'string') return content;
  let text = '';
  for (const block of content) {
    if (block.type === 'text' && typeof block.text === 'string') text += block.text;
    else if (!(ai && TOOL_CALL_BLOCKS.has(block.type))) {
      throw kestrelError('invalid_option', `ChatKestrel: messages[${i}] has a content block of type ${JSON.stringify(block.type)}; Kestrel takes text only`);
    }
  }
  return text;
}

/** The roles of a ChatMessage (LangChain's 'generic' type) in LangChain's names and OpenAI's. */
const ROLES = /** @type {Record<string, string>} */ ({ human: 'user', user: 'user', ai: 'assistant', assistant: 'assistant', system: 'system', developer: 'developer', tool: 'tool' });

/**
 * LangChain's messages as Kestrel's chat messages: system, human, AI (with its tool calls), tool
 * and ChatMessage with a known role.
 * @param {BaseMessage[]} messages
 * @returns {ChatMessage[]}
 */
function toKestrelMessages(messages) {
  return messages.map((message, i) => {
    const type = message.type;
    if (type === 'system' || type === 'human') return { role: type === 'human' ? 'user' : 'system', content: messageText(message.content, i, false) };
    if (type === 'ai') {
      const ai = /** @type {AIMessage} */ (message);
      /** @type {ToolCall[]} */
      const tool_calls = [
        ...(ai.tool_calls ?? []).map((call) => ({ id: call.id ?? '', type: /** @type {const} */ ('function'), function: { name: call.name, arguments: JSON.stringify(call.args) } })),
        // Calls whose arguments were not JSON go back as the model wrote them.
        ...(ai.invalid_tool_calls ?? []).map((call) => ({ id: call.id ?? '', type: /** @type {const} */ ('function'), function: { name: call.name ?? '', arguments: call.args ?? '' } })),
      ];
      const content = messageText(ai.content, i, true);
      return tool_calls.length ? { role: 'assistant', content: content || null, tool_calls } : { role: 'assistant', content };
    }
    if (type === 'tool') {
      const tool = /** @type {BaseMessage & { tool_call_id: string }} */ (message);
      return { role: 'tool', tool_call_id: tool.tool_call_id, content: messageText(tool.content, i, false) };
    }
    if (type === 'generic') {
      const role = ROLES[/** @type {BaseMessage & { role: string }} */ (message).role];
      if (role && role !== 'tool') return { role, content: messageText(message.content, i, false) };
      throw kestrelError('invalid_option', `ChatKestrel: messages[${i}] has role ${JSON.stringify(/** @type {any} */ (message).role)}; Kestrel takes system, developer, user and assistant (tool results as ToolMessage)`);
    }
    throw kestrelError('invalid_option', `ChatKestrel: messages[${i}] is a ${JSON.stringify(type)} message; Kestrel takes system, human, ai, tool and chat messages`);
  });
}

/**
 * Kestrel's tool calls as LangChain's: arguments parsed from their JSON text (a call whose text
 * is not a JSON object is an invalid tool call, with the error).
 * @param {ToolCall[] | undefined} calls
 * @returns {{ tool_calls?: LangChainToolCall[], invalid_tool_calls?: InvalidToolCall[] }}
 */
function fromKestrelToolCalls(calls) {
  if (!calls?.length) return {};
  /** @type {LangChainToolCall[]} */
  const tool_calls = [];
  /** @type {InvalidToolCall[]} */
  const invalid_tool_calls = [];
  for (const { id, function: { name, arguments: text } } of calls) {
    try {
      const args = JSON.parse(text);
      if (args === null || typeof args !== 'object' || Array.isArray(args)) throw new Error('the arguments are not a JSON object');
      tool_calls.push({ type: 'tool_call', id, name, args });
    } catch (e) {
      invalid_tool_calls.push({ type: 'invalid_tool_call', id, name, args: text, error: e instanceof Error ? e.message : String(e) });
    }
  }
  return { tool_calls, invalid_tool_calls };
}

/**
 * Kestrel's usage as LangChain's usage metadata.
 * @param {Usage} usage
 * @returns {UsageMetadata}
 */
function usageMetadata(usage) {
  return {
    input_tokens: usage.prompt_tokens,
    output_tokens: usage.completion_tokens,
    total_tokens: usage.total_tokens,
    input_token_details: { cache_read: usage.prompt_tokens_details.cached_tokens },
  };
}
