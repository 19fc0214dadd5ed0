// A Vercel AI SDK provider over a Kestrel engine, for `ai` 5, 6 and 7: its models implement the
// specification the installed `ai` calls (LanguageModelV2 for ai 5, V3 for ai 6, V4 for ai 7;
// each `ai` refuses a model of a newer one). One core turns the SDK's prompt and settings into one
// chat completion request, and the engine's answer or chunks into content or stream parts; the
// few forms the specifications write differently (the finish reason, the usage, the warnings) come
// from the specification's Shape. Of the AI SDK it loads only `ai`'s package.json, for the
// version; ai-sdk.d.ts declares the provider with the installed `ai`'s types.

/**
 * @import {
 *   LanguageModelV2, LanguageModelV2CallOptions, LanguageModelV2CallWarning, LanguageModelV2FinishReason, LanguageModelV2StreamPart,
 *   LanguageModelV2ToolResultOutput, LanguageModelV2Usage, LanguageModelV3CallOptions, LanguageModelV3GenerateResult,
 *   LanguageModelV3StreamPart, LanguageModelV3StreamResult, LanguageModelV3ToolResultOutput, LanguageModelV4CallOptions,
 *   LanguageModelV4Content, LanguageModelV4FinishReason, LanguageModelV4GenerateResult, LanguageModelV4StreamPart,
 *   LanguageModelV4StreamResult, LanguageModelV4ToolResultOutput, LanguageModelV4Usage, SharedV4Warning,
 * } from '@ai-sdk/provider'
 * @import { ChatCompletionChunk, ChatCompletionRequest, ChatMessage, CreateEngineOptions, Engine, Estimate, Usage } from './index.d.ts'
 * @import { KestrelAvailability, KestrelProvider, KestrelProviderSettings } from './ai-sdk.d.ts'
 */

import aiPackage from 'ai/package.json' with { type: 'json' };
import { estimate } from './index.js';
import { isKestrelError, kestrelError } from './errors.js';
import { lazyEngine } from './lazy-engine.js';

const PROVIDER = 'kestrel';

/**
 * Request fields the provider writes itself: `providerOptions.kestrel` may not set them (the AI
 * SDK's own settings are refused there too, where the call sets them; see `providerFields`).
 */
const OWNED_FIELDS = new Set(['messages', 'prompt', 'stream', 'stream_options', 'signal', 'tools', 'tool_choice', 'response_format']);

/**
 * @typedef {'v2' | 'v3' | 'v4'} Specification a LanguageModel specification's version
 * @typedef {LanguageModelV2CallOptions | LanguageModelV3CallOptions | LanguageModelV4CallOptions} CallOptions
 * @typedef {Awaited<ReturnType<LanguageModelV2['doGenerate']>> | LanguageModelV3GenerateResult | LanguageModelV4GenerateResult} GenerateResult
 * @typedef {Awaited<ReturnType<LanguageModelV2['doStream']>> | LanguageModelV3StreamResult | LanguageModelV4StreamResult} StreamResult
 * @typedef {LanguageModelV2StreamPart | LanguageModelV3StreamPart | LanguageModelV4StreamPart} StreamPart
 */

/**
 * The `ai` majors the provider supports, and the specification each calls its models by (its
 * `resolveLanguageModel` refuses a newer one: ai 5 takes 'v2' only; ai 6 'v3', and 'v2' in a
 * compatibility mode that warns; ai 7 'v4', and older ones the same way). In step with the "ai"
 * peer dependency of package.json.
 * @type {Record<string, Specification>}
 */
const SPECIFICATIONS = { 5: 'v2', 6: 'v3', 7: 'v4' };
const SUPPORTED_AI = 'ai 5, 6 and 7 (its peer dependency "ai": ">=5 <8")';

/**
 * The specification the `ai` of `version` calls; for any other `ai`, a KestrelError that names
 * both.
 * @param {unknown} version
 * @returns {Specification}
 */
function specificationOf(version) {
  const major = typeof version === 'string' ? /^(\d+)\./.exec(version)?.[1] : undefined;
  const specification = major === undefined ? undefined : SPECIFICATIONS[major];
  if (!specification) {
    throw kestrelError('invalid_option', `ai ${String(version)} is installed: @kestrel-llm/web/ai-sdk supports ${SUPPORTED_AI}; install one of those`);
  }
  return specification;
}

/**
 * A warning of a call before a specification writes it: what Kestrel lacks and what it did
 * instead; for LanguageModelV2's own kinds of warning, the setting or the tool it is about.
 * @typedef {{ feature: string, details: string, setting?: 'headers', tool?: object }} Unsupported
 */

/**
 * A finish reason every specification has (V4's 'interrupted' is not Kestrel's).
 * @typedef {'stop' | 'length' | 'tool-calls' | 'error' | 'other'} Unified
 */

/**
 * What the specifications write differently, of what the provider returns: the rest (the
 * content, and a stream's text, tool input, tool call, metadata, raw and error parts) is the same
 * in LanguageModelV2, V3 and V4, as is what the provider reads of a call (the prompt's text, tool
 * calls and tool results, the settings, the tools).
 * @typedef {{
 *   finishReason: (unified: Unified, raw: string | undefined) => unknown,
 *   usage: (usage: Usage | undefined) => unknown,
 *   warning: (warning: Unsupported) => unknown,
 * }} Shape
 */

/** LanguageModelV4's forms, which LanguageModelV3's are. */
const V4_SHAPE = {
  /** @returns {LanguageModelV4FinishReason} */
  finishReason: (/** @type {Unified} */ unified, /** @type {string | undefined} */ raw) => ({ unified, raw }),
  /** @returns {LanguageModelV4Usage} */
  usage(/** @type {Usage | undefined} */ usage) {
    if (!usage) {
      return { inputTokens: { total: undefined, noCache: undefined, cacheRead: undefined, cacheWrite: undefined }, outputTokens: { total: undefined, text: undefined, reasoning: undefined } };
    }
    const cached = usage.prompt_tokens_details?.cached_tokens;
    return {
      inputTokens: { total: usage.prompt_tokens, noCache: cached == null ? undefined : usage.prompt_tokens - cached, cacheRead: cached, cacheWrite: undefined },
      outputTokens: { total: usage.completion_tokens, text: usage.completion_tokens, reasoning: undefined },
      raw: /** @type {any} */ (usage),
    };
  },
  /** @returns {SharedV4Warning} */
  warning: (/** @type {Unsupported} */ { feature, details }) => ({ type: 'unsupported', feature, details }),
};

/** LanguageModelV2's forms: a finish reason's name, flat token counts, its own kinds of warning. */
const V2_SHAPE = {
  /** @returns {LanguageModelV2FinishReason} */
  finishReason: (/** @type {Unified} */ unified) => unified,
  /** @returns {LanguageModelV2Usage} */
  usage: (/** @type {Usage | undefined} */ usage) => ({
    inputTokens: usage?.prompt_tokens,
    outputTokens: usage?.completion_tokens,
    totalTokens: usage?.total_tokens,
    cachedInputTokens: usage?.prompt_tokens_details?.cached_tokens,
  }),
  /** @returns {LanguageModelV2CallWarning} */
  warning(/** @type {Unsupported} */ { feature, details, setting, tool }) {
    if (setting) return { type: 'unsupported-setting', setting, details };
    if (tool) return { type: 'unsupported-tool', tool: /** @type {any} */ (tool), details };
    return { type: 'other', message: `${feature} is not supported: ${details}` };
  },
};

/** @type {Record<Specification, Shape>} */
const SHAPES = { v2: V2_SHAPE, v3: V4_SHAPE, v4: V4_SHAPE };

/**
 * The AI SDK prompt as Kestrel chat messages. What Kestrel cannot take (files, reasoning,
 * provider-executed tools' parts) is left out with a warning.
 * @param {CallOptions['prompt']} prompt
 * @param {Unsupported[]} warnings
 * @returns {ChatMessage[]}
 */
function chatMessages(prompt, warnings) {
  /** @param {string} part */
  const skip = (part) => warnings.push({ feature: part, details: 'Kestrel takes text, tool calls and tool results; this part was left out of the prompt' });
  /** @type {ChatMessage[]} */
  const messages = [];
  for (const message of prompt) {
    if (message.role === 'system') {
      messages.push({ role: 'system', content: message.content });
    } else if (message.role === 'user') {
      let text = '';
      for (const part of message.content) {
        if (part.type === 'text') text += part.text;
        else skip(`${part.type} part in a user message`);
      }
      messages.push({ role: 'user', content: text });
    } else if (message.role === 'assistant') {
      let text = '';
      /** @type {NonNullable<ChatMessage['tool_calls']>} */
      const calls = [];
      for (const part of message.content) {
        if (part.type === 'text') text += part.text;
        else if (part.type === 'tool-call' && !part.providerExecuted) {
          calls.push({ id: part.toolCallId, type: 'function', function: { name: part.toolName, arguments: JSON.stringify(part.input ?? {}) } });
        } else skip(`${part.type === 'tool-call' ? 'provider-executed tool-call' : part.type} part in an assistant message`);
      }
      messages.push(calls.length ? { role: 'assistant', content: text || null, tool_calls: calls } : { role: 'assistant', content: text });
    } else if (message.role === 'tool') {
      for (const part of message.content) {
        if (part.type === 'tool-result') messages.push({ role: 'tool', tool_call_id: part.toolCallId, content: toolOutput(part.output, skip) });
        else skip(`${part.type} part in a tool message`);
      }
    } else {
      throw kestrelError('invalid_option', `invalid option prompt: unknown message role ${JSON.stringify(/** @type {{ role: unknown }} */ (message).role)}`);
    }
  }
  return messages;
}

/**
 * A tool result as the text of a `tool` message (OpenAI's form: JSON values as JSON text).
 * @param {LanguageModelV2ToolResultOutput | LanguageModelV3ToolResultOutput | LanguageModelV4ToolResultOutput} output
 * @param {(part: string) => void} skip
 * @returns {string}
 */
function toolOutput(output, skip) {
  switch (output.type) {
    case 'text':
    case 'error-text':
      return output.value;
    case 'json':
    case 'error-json':
      return JSON.stringify(output.value);
    case 'execution-denied':
      return output.reason ?? 'Tool execution denied.';
    case 'content': {
      let text = '';
      for (const part of output.value) {
        if (part.type === 'text') text += part.text;
        else skip(`${part.type} part in a tool result`);
      }
      return text;
    }
    default:
      throw kestrelError('invalid_option', `invalid option prompt: unknown tool result type ${JSON.stringify(/** @type {{ type: unknown }} */ (output).type)}`);
  }
}

/**
 * `providerOptions.kestrel`: Kestrel's own request fields. One the provider writes, or one the
 * call's settings already set, is `invalid_option` (two values of one field, no silent winner).
 * @param {unknown} options
 * @param {Record<string, unknown>} request the request made from the call's settings
 * @returns {Record<string, unknown>}
 */
function providerFields(options, request) {
  if (options == null) return {};
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw kestrelError('invalid_option', 'invalid option providerOptions.kestrel: expected an object of Kestrel request fields');
  }
  for (const [key, value] of Object.entries(options)) {
    if (OWNED_FIELDS.has(key)) {
      throw kestrelError('invalid_option', `invalid option providerOptions.kestrel.${key}: the provider sets it from the AI SDK call`);
    }
    if (request[key] !== undefined && value !== undefined) {
      throw kestrelError('invalid_option', `invalid option providerOptions.kestrel.${key}: the AI SDK call already sets it`);
    }
  }
  return /** @type {Record<string, unknown>} */ (options);
}

/**
 * The Kestrel chat completion request of an AI SDK call, and the call's warnings.
 * @param {CallOptions} options
 * @returns {{ request: ChatCompletionRequest, warnings: Unsupported[] }}
 */
function chatRequest(options) {
  /** @type {Unsupported[]} */
  const warnings = [];
  /** @type {Record<string, unknown>} */
  const request = {
    messages: chatMessages(options.prompt, warnings),
    max_tokens: options.maxOutputTokens,
    temperature: options.temperature,
    top_p: options.topP,
    top_k: options.topK,
    presence_penalty: options.presencePenalty,
    frequency_penalty: options.frequencyPenalty,
    seed: options.seed,
    stop: options.stopSequences?.length ? options.stopSequences : undefined,
  };
  const format = options.responseFormat;
  if (format?.type === 'json') {
    request.response_format = format.schema
      ? { type: 'json_schema', json_schema: { name: format.name ?? 'response', ...(format.description != null && { description: format.description }), schema: format.schema } }
      : { type: 'json_object' };
  }
  /** @type {NonNullable<ChatCompletionRequest['tools']>} */
  const tools = [];
  for (const tool of options.tools ?? []) {
    if (tool.type !== 'function') {
      warnings.push({ feature: `provider tool ${tool.name}`, details: 'Kestrel runs function tools only; this tool was not given to the model', tool });
      continue;
    }
    // inputExamples and strict are V3's and V4's.
    if ('inputExamples' in tool && tool.inputExamples?.length) {
      warnings.push({ feature: `inputExamples of tool ${tool.name}`, details: 'Kestrel shows the model a tool\'s description and schema only' });
    }
    /** @type {NonNullable<ChatCompletionRequest['tools']>[number]['function']} */
    const fn = { name: tool.name, parameters: /** @type {Record<string, unknown>} */ (tool.inputSchema) };
    if (tool.description != null) fn.description = tool.description;
    if ('strict' in tool && tool.strict != null) fn.strict = tool.strict;
    tools.push({ type: 'function', function: fn });
  }
  if (tools.length) {
    request.tools = tools;
    const choice = options.toolChoice;
    if (choice) request.tool_choice = choice.type === 'tool' ? { type: 'function', function: { name: choice.toolName } } : choice.type;
  }
  // A setting of V4's only.
  if ('reasoning' in options && options.reasoning != null && options.reasoning !== 'provider-default') {
    warnings.push({ feature: 'reasoning', details: 'Kestrel has no reasoning effort setting' });
  }
  // Headers are for HTTP providers (the spec's words); the AI SDK always adds its user agent.
  const headers = Object.keys(options.headers ?? {}).filter((name) => name.toLowerCase() !== 'user-agent');
  if (headers.length) warnings.push({ feature: 'headers', details: `Kestrel makes no HTTP request of its own: ${headers.join(', ')} not sent`, setting: 'headers' });
  Object.assign(request, providerFields(options.providerOptions?.[PROVIDER], request));
  for (const key of Object.keys(request)) if (request[key] === undefined) delete request[key];
  return { request: /** @type {ChatCompletionRequest} */ (/** @type {unknown} */ (request)), warnings };
}

/**
 * Kestrel's finish_reason as the AI SDK's.
 * @param {string | null | undefined} reason
 * @returns {Unified}
 */
function unified(reason) {
  return reason === 'stop' ? 'stop' : reason === 'length' ? 'length' : reason === 'tool_calls' ? 'tool-calls' : 'other';
}

/**
 * What an aborted call rejects with: the signal's reason, as `fetch` does (the AI SDK then
 * reports an abort, not an error).
 * @param {AbortSignal | undefined} signal
 */
function abortError(signal) {
  return signal?.reason ?? new DOMException('This operation was aborted', 'AbortError');
}

/**
 * The name a model gets when none is given: the model file's.
 * @param {KestrelProviderSettings} settings
 */
function defaultModelId(settings) {
  const model = 'engine' in settings ? null : settings.model;
  if (typeof model === 'string' || model instanceof URL) return String(model).split(/[?#]/)[0].split('/').pop() || PROVIDER;
  if (globalThis.File && model instanceof File) return model.name;
  return 'engine' in settings ? settings.engine.info?.model?.name ?? PROVIDER : PROVIDER;
}

/**
 * A Kestrel model in the form of one specification: the same requests and answers, written as
 * `specificationVersion`'s Shape says.
 */
class KestrelChatModel {
  provider = /** @type {const} */ ('kestrel');
  /** Kestrel reads no URL itself: the AI SDK downloads files (which are then left out, with a warning). */
  supportedUrls = {};

  /**
   * @param {string} modelId
   * @param {() => Promise<Engine>} engine
   * @param {Specification} specification
   */
  constructor(modelId, engine, specification) {
    this.specificationVersion = specification;
    this.modelId = modelId;
    this.#engine = engine;
    this.#shape = SHAPES[specification];
  }

  /** @type {() => Promise<Engine>} */
  #engine;
  /** @type {Shape} */
  #shape;

  /**
   * A call's request and warnings, and the engine once loaded; an aborted signal rejects, before
   * the load and after it.
   * @param {CallOptions} options
   */
  async #prepare(options) {
    const { request, warnings } = chatRequest(options);
    const signal = options.abortSignal;
    if (signal?.aborted) throw abortError(signal);
    const engine = await this.#engine();
    if (signal?.aborted) throw abortError(signal);
    return { request, warnings, signal, engine };
  }

  /**
   * @param {CallOptions} options
   * @returns {Promise<GenerateResult>}
   */
  async doGenerate(options) {
    const shape = this.#shape;
    const { request, warnings, signal, engine } = await this.#prepare(options);
    const answer = await engine.chat.completions.create({ ...request, stream: false, signal });
    const choice = answer.choices[0];
    if (choice.finish_reason === 'abort') throw abortError(signal);
    /** @type {LanguageModelV4Content[]} the same in V2 and V3 */
    const content = [];
    if (choice.message.content) content.push({ type: 'text', text: choice.message.content });
    for (const call of choice.message.tool_calls ?? []) {
      content.push({ type: 'tool-call', toolCallId: call.id, toolName: call.function.name, input: call.function.arguments });
    }
    return /** @type {GenerateResult} */ ({
      content,
      finishReason: shape.finishReason(unified(choice.finish_reason), choice.finish_reason ?? undefined),
      usage: shape.usage(answer.usage),
      warnings: warnings.map(shape.warning),
      request: { body: request },
      response: { id: answer.id, timestamp: new Date(answer.created * 1000), modelId: answer.model, body: answer },
      ...(answer.kestrel?.timings ? { providerMetadata: { [PROVIDER]: { timings: { ...answer.kestrel.timings } } } } : {}),
    });
  }

  /**
   * @param {CallOptions} options
   * @returns {Promise<StreamResult>}
   */
  async doStream(options) {
    const { request, warnings, signal, engine } = await this.#prepare(options);
    const chunks = (await engine.chat.completions.create({ ...request, stream: true, signal }))[Symbol.asyncIterator]();
    const stream = streamParts(chunks, warnings, this.#shape, options.includeRawChunks === true, signal);
    return /** @type {StreamResult} */ ({ stream, request: { body: request } });
  }
}

/**
 * Kestrel's chunks as the specification's stream parts: stream-start (with the warnings),
 * response-metadata, one text block (text-start, -delta, -end), each tool call's input
 * (tool-input-start, -delta, -end) and then the call, and finish with the usage. A failure is an
 * error part before a finish with reason 'error'; an abort errors the stream with the signal's
 * reason; cancelling the stream stops the generation.
 * @param {AsyncIterator<ChatCompletionChunk>} chunks
 * @param {Unsupported[]} warnings
 * @param {Shape} shape the specification's forms of the warnings, finish reason and usage
 * @param {boolean} raw whether to add each chunk as a raw part
 * @param {AbortSignal | undefined} signal
 * @returns {ReadableStream<StreamPart>}
 */
function streamParts(chunks, warnings, shape, raw, signal) {
  const TEXT_ID = 'text-0';
  let started = false;
  let textOpen = false;
  /** @type {string | null} */
  let finish = null;
  /** @type {Usage | undefined} */
  let usage;
  /** Tool calls by their index, as their deltas arrive (OpenAI's form: the first names the call). */
  /** @type {Map<number, { id: string, name: string, args: string }>} */
  const calls = new Map();
  /** The one part the specifications write differently: the finish, with its reason and usage. */
  const finishPart = (/** @type {Unified} */ reason, /** @type {string | undefined} */ rawReason, /** @type {Usage | undefined} */ counts) => (
    /** @type {StreamPart} */ ({ type: 'finish', usage: shape.usage(counts), finishReason: shape.finishReason(reason, rawReason) })
  );

  /**
   * The parts of the next chunk, or of the end (`last`: the stream is over; `abort`: it was aborted).
   * @returns {Promise<{ parts: StreamPart[], last?: boolean, abort?: boolean }>}
   */
  async function next() {
    /** @type {IteratorResult<ChatCompletionChunk>} */
    let item;
    try {
      item = await chunks.next();
    } catch (error) {
      if (signal?.aborted) return { parts: [], abort: true };
      return { parts: [{ type: 'error', error }, finishPart('error', undefined, undefined)], last: true };
    }
    if (item.done) {
      if (finish === 'abort' || signal?.aborted) return { parts: [], abort: true };
      /** @type {StreamPart[]} */
      const parts = textOpen ? [{ type: 'text-end', id: TEXT_ID }] : [];
      for (const call of calls.values()) {
        parts.push({ type: 'tool-input-end', id: call.id }, { type: 'tool-call', toolCallId: call.id, toolName: call.name, input: call.args });
      }
      parts.push(finishPart(unified(finish), finish ?? undefined, usage));
      return { parts, last: true };
    }
    const chunk = item.value;
    /** @type {StreamPart[]} */
    const parts = raw ? [{ type: 'raw', rawValue: chunk }] : [];
    if (!started) {
      started = true;
      parts.push({ type: 'response-metadata', id: chunk.id, timestamp: new Date(chunk.created * 1000), modelId: chunk.model });
    }
    const choice = chunk.choices[0];
    const text = choice?.delta?.content;
    if (text) {
      if (!textOpen) parts.push({ type: 'text-start', id: TEXT_ID });
      textOpen = true;
      parts.push({ type: 'text-delta', id: TEXT_ID, delta: text });
    }
    for (const delta of choice?.delta?.tool_calls ?? []) {
      let call = calls.get(delta.index);
      if (!call) {
        call = { id: delta.id, name: delta.function.name, args: '' };
        calls.set(delta.index, call);
        parts.push({ type: 'tool-input-start', id: call.id, toolName: call.name });
      }
      const args = delta.function?.arguments ?? '';
      if (args) {
        call.args += args;
        parts.push({ type: 'tool-input-delta', id: call.id, delta: args });
      }
    }
    if (choice?.finish_reason) finish = choice.finish_reason;
    if (chunk.usage) usage = chunk.usage;
    return { parts };
  }

  return new ReadableStream({
    start(controller) {
      controller.enqueue(/** @type {StreamPart} */ ({ type: 'stream-start', warnings: warnings.map(shape.warning) }));
    },
    async pull(controller) {
      // A pull that enqueues nothing is not called again (the stream waits for an enqueue), so
      // chunks that give no part (the role's, the finish's) are read past here.
      for (;;) {
        const { parts, last, abort } = await next();
        if (abort) return controller.error(abortError(signal));
        for (const part of parts) controller.enqueue(part);
        if (last) return controller.close();
        if (parts.length) return;
      }
    },
    async cancel() {
      // Ends the `for await` of the engine's stream, which aborts the generation.
      await chunks.return?.();
    },
  }, { highWaterMark: 0 });
}

/**
 * The error the AI SDK documents for a model a provider does not have (its NoSuchModelError,
 * recognised by `NoSuchModelError.isInstance` through the SDK's error markers).
 * @param {string} modelId
 * @param {'embeddingModel' | 'textEmbeddingModel' | 'imageModel'} modelType
 */
function noSuchModel(modelId, modelType) {
  const error = new Error(`No such ${modelType}: ${modelId} (Kestrel runs chat models only)`);
  error.name = 'AI_NoSuchModelError';
  Object.assign(error, { modelId, modelType, [Symbol.for('vercel.ai.error')]: true, [Symbol.for('vercel.ai.error.AI_NoSuchModelError')]: true });
  return error;
}

/**
 * Whether the model fits, by `estimate()`, on the backend createEngine would use.
 * @param {CreateEngineOptions} options
 * @returns {Promise<KestrelAvailability>}
 */
async function estimated(options) {
  /** @type {Estimate} */
  let fit;
  try {
    fit = await estimate({
      model: /** @type {string | URL | Blob} */ (options.model), context_length: options.context_length, kv_cache: options.kv_cache, slots: options.slots,
      draftModel: options.draftModel,
    });
  } catch (e) {
    if (isKestrelError(e)) return { status: 'unavailable', code: e.code, reason: e.message };
    throw e;
  }
  const backend = options.backend ?? 'auto';
  const gpu = backend !== 'cpu' && fit.fits;
  const cpu = backend !== 'webgpu' && fit.cpu.fits;
  if (gpu || cpu) return { status: 'downloadable', estimate: fit };
  // The verdict of the backend that would run it: 'auto' falls back to the CPU, so its reason is the CPU's.
  const why = backend === 'webgpu' ? fit : fit.cpu;
  return { status: 'unavailable', code: why.code ?? 'device_limits', reason: why.reason ?? 'the model does not fit', estimate: fit };
}

/**
 * A Vercel AI SDK provider of a Kestrel engine's model (see ai-sdk.d.ts).
 * @param {KestrelProviderSettings} settings
 * @returns {KestrelProvider}
 */
export function createKestrel(settings) {
  const specification = specificationOf(aiPackage.version);
  const source = lazyEngine(settings);
  const given = source.given;
  const options = /** @type {CreateEngineOptions} */ (source.options ?? {});
  let givenUnloaded = false;

  const engine = () => (givenUnloaded ? Promise.reject(kestrelError('unloaded', 'the engine was unloaded')) : source.load());

  const languageModel = (/** @type {string | undefined} */ modelId) => new KestrelChatModel(modelId ?? defaultModelId(settings), engine, specification);
  const provider = /** @type {KestrelProvider} */ (/** @type {unknown} */ (languageModel));
  Object.assign(provider, {
    // ProviderV3 and V4 name their version; ProviderV2 (ai 5) has none, and ai 6 and 7 take a
    // provider without one for a V2 provider.
    ...(specification !== 'v2' && { specificationVersion: specification }),
    languageModel,
    embeddingModel: (/** @type {string} */ modelId) => { throw noSuchModel(modelId, 'embeddingModel'); },
    // ProviderV2's name of it.
    textEmbeddingModel: (/** @type {string} */ modelId) => { throw noSuchModel(modelId, 'textEmbeddingModel'); },
    imageModel: (/** @type {string} */ modelId) => { throw noSuchModel(modelId, 'imageModel'); },
    engine,
    /** @returns {Promise<KestrelAvailability>} */
    async availability() {
      if (given) return givenUnloaded ? { status: 'unavailable', code: 'unloaded', reason: 'the engine was unloaded' } : { status: 'available' };
      if (source.loaded) return { status: 'available' };
      if (source.loading) return { status: 'downloading' };
      return estimated(options);
    },
    async unload() {
      if (given) {
        givenUnloaded = true;
        return (await given).unload();
      }
      await (await source.forget())?.unload();
    },
  });
  return provider;
}
