// Chrome's Prompt API (`LanguageModel`, https://webmachinelearning.github.io/prompt-api/) over a
// Kestrel engine, so that code written for Chrome's built-in model runs on any browser with WebGPU
// or wasm. A session keeps its conversation as chat messages and sends all of them with each
// request: the engine reuses the KV cache of the prefix it has already read, so a turn prefills only
// what is new. Token counts are the engine's own (`usage.prompt_tokens`), never an estimate.

/**
 * @import { ChatCompletion, ChatMessage, Engine, LoadProgress, CreateEngineOptions } from './index.d.ts'
 * @import {
 *   Availability, LanguageModelConstructor, LanguageModelCreateCoreOptions, LanguageModelCreateOptions,
 *   LanguageModel as LanguageModelApi, LanguageModelParams, LanguageModelPromptOptions, LanguageModelSource, CreateMonitor as CreateMonitorApi,
 * } from './prompt-api.d.ts'
 */

import { kestrelError } from './errors.js';
import { estimate, hasModelInCache, isKestrelError } from './index.js';
import { lazyEngine } from './lazy-engine.js';

// Without topK or temperature a session samples as the engine does by default (llama.cpp's
// defaults); the maxima are Chrome's (its `LanguageModel.params()`).
const DEFAULT_TOP_K = 40;
const DEFAULT_TEMPERATURE = 0.8;
const MAX_TOP_K = 128;
const MAX_TEMPERATURE = 2;

const ROLES = ['system', 'user', 'assistant'];
const TYPES = ['text', 'image', 'audio', 'tool-call', 'tool-response'];

/**
 * @param {string} name a DOMException name
 * @param {string} message
 */
function domError(name, message) {
  return new DOMException(message, name);
}

/**
 * The Prompt API's QuotaExceededError: Chrome's DOMException subclass where the browser has it,
 * else a DOMException of that name, both with `requested` and `quota`.
 * @param {number} requested
 * @param {number} quota
 */
function quotaExceeded(requested, quota) {
  const message = `the input needs ${requested} tokens of context but the session has ${quota}`;
  const Quota = /** @type {any} */ (globalThis).QuotaExceededError;
  if (typeof Quota === 'function') return /** @type {DOMException} */ (new Quota(message, { requested, quota }));
  return Object.defineProperties(domError('QuotaExceededError', message), { requested: { value: requested }, quota: { value: quota } });
}

/**
 * The tokens a request that overflowed the context needs (the engine's `context_overflow` says
 * "the prompt and generation need N tokens": the prompt and one generated token), or null.
 * @param {unknown} e
 */
function overflowNeeds(e) {
  if (!isKestrelError(e) || e.code !== 'context_overflow') return null;
  const needed = /need (\d+) tokens/.exec(e.message);
  return needed ? Number(needed[1]) : null;
}

/**
 * A failed request as the Prompt API reports it: the DOMException names its spec lists.
 * @param {unknown} e
 * @param {boolean} constrained whether the request had a responseConstraint
 */
function requestError(e, constrained) {
  if (!isKestrelError(e)) return e;
  // The engine checks the constraint as it compiles it: a schema keyword or regex syntax it lacks.
  if (constrained && e.code === 'invalid_option') return domError('NotSupportedError', `the responseConstraint is not supported: ${e.message}`);
  if (e.code === 'unloaded') return domError('InvalidStateError', `the engine was unloaded: ${e.message}`);
  return domError('UnknownError', `${e.code}: ${e.message}`);
}

/**
 * A failed load as `create()` reports it.
 * @param {unknown} e
 */
function loadError(e) {
  if (!isKestrelError(e)) return e;
  if (e.code === 'fetch_failed') return domError('NetworkError', e.message);
  if (['no_webgpu', 'device_limits', 'unsupported_quant', 'out_of_memory'].includes(e.code)) return domError('NotSupportedError', `${e.code}: ${e.message}`);
  return domError('OperationError', `${e.code}: ${e.message}`);
}

/**
 * Resolves as `promise` does, or rejects with `signal`'s reason once it aborts (`onAbort` first).
 * @template T
 * @param {Promise<T>} promise
 * @param {AbortSignal | undefined} signal
 * @param {() => void} [onAbort]
 * @returns {Promise<T>}
 */
function untilAborted(promise, signal, onAbort) {
  if (!signal) return promise;
  return new Promise((resolve, reject) => {
    const abort = () => {
      onAbort?.();
      reject(signal.reason);
    };
    if (signal.aborted) {
      promise.catch(() => {});
      abort();
      return;
    }
    signal.addEventListener('abort', abort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', abort));
  });
}

/**
 * A list option (WebIDL sequence): an iterable, else TypeError.
 * @param {unknown} value
 * @param {string} name
 * @returns {unknown[]}
 */
function sequence(value, name) {
  if (value == null || typeof value !== 'object' || typeof (/** @type {any} */ (value))[Symbol.iterator] !== 'function') {
    throw new TypeError(`${name} must be a list`);
  }
  return [.../** @type {Iterable<unknown>} */ (value)];
}

/**
 * `expectedInputs` / `expectedOutputs` checked, their language tags canonicalized (a bad tag is a
 * RangeError); returns the first type Kestrel cannot take (only text), or null.
 * @param {unknown} list
 * @param {string} name
 */
function unsupportedType(list, name) {
  if (list === undefined) return null;
  let unsupported = null;
  for (const expected of sequence(list, name)) {
    const { type, languages } = /** @type {{ type?: unknown, languages?: unknown }} */ (expected ?? {});
    if (typeof type !== 'string' || !TYPES.includes(type)) throw new TypeError(`${name}: type must be one of ${TYPES.join(', ')}`);
    if (languages !== undefined) Intl.getCanonicalLocales(/** @type {string[]} */ (sequence(languages, `${name} languages`)));
    if (type !== 'text') unsupported ??= type;
  }
  return unsupported;
}

/**
 * The create/availability options checked: the sampling parameters (RangeError below their
 * minimum, clamped to their maximum, topK floored), and why Kestrel cannot serve them (null: it can).
 * @param {LanguageModelCreateCoreOptions} options
 * @returns {{ topK: number, temperature: number, unsupported: string | null }}
 */
function coreOptions(options) {
  const { topK, temperature, samplingMode, tools } = options;
  let k = DEFAULT_TOP_K;
  let t = DEFAULT_TEMPERATURE;
  if (topK !== undefined) {
    k = Number(topK);
    if (!(k >= 1)) throw new RangeError(`topK must be at least 1, got ${topK}`);
    k = Math.min(Math.floor(k), MAX_TOP_K);
  }
  if (temperature !== undefined) {
    t = Number(temperature);
    if (!(t >= 0)) throw new RangeError(`temperature must be at least 0, got ${temperature}`);
    t = Math.min(t, MAX_TEMPERATURE);
  }
  if (samplingMode !== undefined && (topK !== undefined || temperature !== undefined)) throw new TypeError('samplingMode cannot be given with topK or temperature');
  const input = unsupportedType(options.expectedInputs, 'expectedInputs');
  const output = unsupportedType(options.expectedOutputs, 'expectedOutputs');
  let unsupported = null;
  if (input) unsupported = `${input} input is not supported (Kestrel runs text-only language models)`;
  else if (output) unsupported = `${output} output is not supported (only text)`;
  else if (tools !== undefined && sequence(tools, 'tools').length > 0) unsupported = 'tool use is not supported by this adapter';
  else if (samplingMode !== undefined && samplingMode !== 'balanced') unsupported = `samplingMode ${samplingMode} is not supported (only 'balanced', or topK and temperature)`;
  return { topK: k, temperature: t, unsupported };
}

/**
 * The spec's "validate and canonicalize a prompt": the messages of `input` with their text parts
 * joined, as the engine takes them. Only text is supported (image, audio and tool parts reject with
 * NotSupportedError, as for a session whose expectedInputs do not list them); a system message
 * only first in the session (`hasAppended`: something came before); `prefix` continuations are not
 * supported (the engine always starts a new assistant turn).
 * @param {unknown} input
 * @param {boolean} hasAppended
 * @returns {ChatMessage[]}
 */
function canonicalPrompt(input, hasAppended) {
  // WebIDL's (sequence or DOMString): what is not iterable is converted to a string.
  if (typeof input === 'string' || input == null || typeof (/** @type {any} */ (input))[Symbol.iterator] !== 'function') {
    return [{ role: 'user', content: String(input) }];
  }
  const list = [.../** @type {Iterable<unknown>} */ (input)];
  if (list.length === 0) return [{ role: 'user', content: '' }];
  return list.map((message, i) => {
    if (message == null || typeof message !== 'object') throw new TypeError('each message must be an object with role and content');
    const { role, content, prefix } = /** @type {{ role?: unknown, content?: unknown, prefix?: unknown }} */ (message);
    if (typeof role !== 'string' || !ROLES.includes(role)) throw new TypeError(`a message's role must be one of ${ROLES.join(', ')}`);
    if (content === undefined) throw new TypeError("a message's content is required");
    if (prefix) {
      if (role !== 'assistant' || i !== list.length - 1) throw domError('SyntaxError', 'only the last message, an assistant one, may be a prefix');
      throw domError('NotSupportedError', 'assistant prefixes are not supported (the engine starts a new answer after the messages)');
    }
    if (role === 'system' && (hasAppended || i > 0)) throw new TypeError('a system message must be the first message of the session');
    let text = '';
    for (const part of typeof content === 'string' ? [{ type: 'text', value: content }] : sequence(content, "a message's content")) {
      const { type, value } = /** @type {{ type?: unknown, value?: unknown }} */ (part ?? {});
      if (typeof type !== 'string' || !TYPES.includes(type)) throw new TypeError(`a content part's type must be one of ${TYPES.join(', ')}`);
      if (type !== 'text') throw domError('NotSupportedError', `${type} content is not supported (Kestrel runs text-only language models)`);
      if (typeof value !== 'string') throw new TypeError("a text part's value must be a string");
      text += value;
    }
    return { role, content: text };
  });
}

/**
 * A responseConstraint as the engine's request fields, and the message that shows it to the model
 * (left out with omitResponseConstraintInput). A RegExp's flags become inline flags; its `^` and
 * `$` at the ends go, since the engine's regex always matches the whole answer.
 * @param {LanguageModelPromptOptions} options
 * @returns {{ fields: { response_format?: any, regex?: string }, guide: ChatMessage | null } | null}
 */
function constraint(options) {
  const { responseConstraint, omitResponseConstraintInput } = options;
  if (responseConstraint === undefined || responseConstraint === null) {
    if (omitResponseConstraintInput) throw new TypeError('omitResponseConstraintInput needs a responseConstraint');
    return null;
  }
  if (responseConstraint instanceof RegExp) {
    const inline = [...responseConstraint.flags].filter((f) => 'ims'.includes(f)).join('');
    let source = responseConstraint.source.replace(/^\^/, '');
    if (/(^|[^\\])(\\\\)*\$$/.test(source)) source = source.slice(0, -1);
    const regex = (inline ? `(?${inline})` : '') + source;
    const guide = { role: 'user', content: `Respond with text that matches this regular expression: ${responseConstraint.source}` };
    return { fields: { regex }, guide: omitResponseConstraintInput ? null : guide };
  }
  if (typeof responseConstraint !== 'object') throw new TypeError('responseConstraint must be a JSON Schema object or a RegExp');
  const schema = /** @type {Record<string, unknown>} */ (responseConstraint);
  const guide = { role: 'user', content: `Respond with JSON that matches this JSON Schema: ${JSON.stringify(schema)}` };
  return {
    fields: { response_format: { type: 'json_schema', json_schema: { name: 'response', schema, strict: true } } },
    guide: omitResponseConstraintInput ? null : guide,
  };
}

/** `create()`'s monitor: `downloadprogress` events, and its `ondownloadprogress` handler. */
class CreateMonitor extends EventTarget {
  /** @type {CreateMonitorApi['ondownloadprogress']} */
  ondownloadprogress = null;

  constructor() {
    super();
    this.addEventListener('downloadprogress', (e) => this.ondownloadprogress?.call(this, /** @type {ProgressEvent} */ (e)));
  }

  /**
   * A `downloadprogress` event with `loaded` the fraction (0 to 1) and `total` 1.
   * @param {number} loaded
   */
  progress(loaded) {
    const event = new ProgressEvent('downloadprogress', { loaded, total: 1, lengthComputable: true });
    // Browsers whose ProgressEvent still has integer fields would round the fraction down.
    if (event.loaded !== loaded) Object.defineProperty(event, 'loaded', { value: loaded });
    this.dispatchEvent(event);
  }
}

/**
 * The adapter's own `maxTokens`, checked, and the engine of the rest (lazy-engine.js).
 * @param {LanguageModelSource} source
 */
function engineSource(source) {
  const { maxTokens, ...settings } = /** @type {LanguageModelSource} */ (source ?? {});
  if (maxTokens !== undefined && !(Number.isSafeInteger(maxTokens) && maxTokens >= 1)) {
    throw kestrelError('invalid_option', 'invalid option maxTokens: expected a positive integer');
  }
  return { maxTokens, holder: lazyEngine(settings) };
}

/**
 * A session's state as `create()` and `clone()` make it.
 * @typedef {{
 *   engine: Engine, history: ChatMessage[], initial: number, usage: number, topK: number, temperature: number,
 *   maxTokens: number | undefined,
 * }} State
 */

/** What a class of createLanguageModel runs on: its engine, and the adapter's own `maxTokens`. */
/** @typedef {ReturnType<typeof engineSource>} Source */

/** The source of each class createLanguageModel made. */
/** @type {WeakMap<Function, Source>} */
const sources = new WeakMap();

/** Sessions come from `create()` and `clone()` only: their constructor takes this token. */
const CONSTRUCTING = Symbol('LanguageModel');

/**
 * The source of `constructor`, a class of createLanguageModel.
 * @param {Function} constructor
 */
function sourceOf(constructor) {
  const source = sources.get(constructor);
  if (!source) throw new TypeError('Illegal invocation: use a LanguageModel of createLanguageModel()');
  return source;
}

/**
 * A session of the Prompt API over a Kestrel engine (`LanguageModel`); its statics answer for the
 * source of the class createLanguageModel made (`sourceOf`).
 */
class LanguageModelSession extends EventTarget {
  /** @type {number | undefined} */
  #maxTokens;
  /** @type {Engine} */
  #engine;
  /** The conversation, as the engine takes it; its first `#initial` messages never go. */
  /** @type {ChatMessage[]} */
  #history;
  #initial;
  /** The tokens of the conversation, as the engine counted them in its last request. */
  #usage;
  #topK;
  #temperature;
  /** @type {DOMException | null} */
  #destroyed = null;
  #destruction = new AbortController();
  /** Operations that change the conversation run one at a time, in call order. */
  /** @type {Promise<unknown>} */
  #queue = Promise.resolve();
  /** @type {LanguageModelApi['oncontextoverflow']} */
  oncontextoverflow = null;
  /** @type {LanguageModelApi['onquotaoverflow']} */
  onquotaoverflow = null;

  /**
   * Sessions come from `create()` and `clone()` only.
   * @param {symbol} token
   * @param {State} state
   */
  constructor(token, state) {
    if (token !== CONSTRUCTING) throw new TypeError('Illegal constructor: use LanguageModel.create()');
    super();
    this.#maxTokens = state.maxTokens;
    this.#engine = state.engine;
    this.#history = state.history;
    this.#initial = state.initial;
    this.#usage = state.usage;
    this.#topK = state.topK;
    this.#temperature = state.temperature;
    this.addEventListener('contextoverflow', (e) => this.oncontextoverflow?.call(this, e));
    this.addEventListener('quotaoverflow', (e) => this.onquotaoverflow?.call(this, e));
  }

  /**
   * 'available' once the engine is loaded (or a File/Blob or a cached model needs no download),
   * 'downloading' while it loads, 'downloadable' where the model's header says it fits the
   * backend, 'unavailable' where it does not, or the options ask for what Kestrel lacks.
   * @param {LanguageModelCreateCoreOptions} [options]
   * @returns {Promise<Availability>}
   */
  static async availability(options = {}) {
    const { holder } = sourceOf(this);
    if (coreOptions(options).unsupported) return 'unavailable';
    if (holder.given || holder.loaded) return 'available';
    if (holder.loading) return 'downloading';
    const { model, backend = 'auto', context_length, kv_cache, slots, draftModel } = /** @type {CreateEngineOptions} */ (holder.options);
    let fit;
    try {
      fit = await estimate({ model, context_length, kv_cache, slots, draftModel });
    } catch (e) {
      if (isKestrelError(e) && (e.code === 'bad_model' || e.code === 'unsupported_quant')) return 'unavailable';
      throw domError('UnknownError', isKestrelError(e) ? `${e.code}: ${e.message}` : String(e));
    }
    const fits = backend === 'cpu' ? fit.cpu.fits : backend === 'webgpu' ? fit.fits : fit.fits || fit.cpu.fits;
    if (!fits) return 'unavailable';
    if (typeof model !== 'string' && !(model instanceof URL)) return 'available';
    return (await hasModelInCache(String(model))) ? 'available' : 'downloadable';
  }

  /**
   * The sampling parameters' defaults (the engine's) and maxima (Chrome's).
   * @returns {Promise<LanguageModelParams>}
   */
  static async params() {
    return { defaultTopK: DEFAULT_TOP_K, maxTopK: MAX_TOP_K, defaultTemperature: DEFAULT_TEMPERATURE, maxTemperature: MAX_TEMPERATURE };
  }

  /**
   * A session: loads the engine first where it is not (reporting to `monitor`), then reads the
   * initial prompts.
   * @param {LanguageModelCreateOptions} [options]
   * @returns {Promise<LanguageModelSession>}
   */
  static async create(options = {}) {
    const { maxTokens, holder } = sourceOf(this);
    const { signal } = options;
    signal?.throwIfAborted();
    const core = coreOptions(options);
    if (core.unsupported) throw domError('NotSupportedError', core.unsupported);
    const initial = options.initialPrompts === undefined ? [] : canonicalPrompt(sequence(options.initialPrompts, 'initialPrompts'), false);
    const monitor = new CreateMonitor();
    options.monitor?.(monitor);
    // The bytes read of the model file (downloaded, or read from the Cache API or a File) as a
    // fraction: 0 first and 1 last, always, as the spec has it.
    let reported = 0;
    monitor.progress(0);
    /** @param {LoadProgress} p */
    const onProgress = (p) => {
      if (!['download', 'cache', 'upload'].includes(p.phase) || !(p.total > 0)) return;
      const fraction = Math.min(p.loaded / p.total, 1);
      if (fraction > reported && fraction < 1) monitor.progress((reported = fraction));
    };
    const engine = await untilAborted(holder.load(onProgress), signal, () => holder.unlisten(onProgress)).catch((e) => {
      throw signal?.aborted ? e : loadError(e);
    });
    holder.unlisten(onProgress);
    monitor.progress(1);
    const context = /** @type {NonNullable<Engine['info']['model']>} */ (engine.info.model).context_length;
    const session = new this(CONSTRUCTING, { engine, history: [], initial: 0, usage: 0, topK: core.topK, temperature: core.temperature, maxTokens });
    if (initial.length > 0) {
      const composite = signal ? AbortSignal.any([signal, session.#destruction.signal]) : session.#destruction.signal;
      const read = await untilAborted(session.#read(initial, composite, false), composite);
      if ('needed' in read) throw quotaExceeded(read.needed, context);
      session.#history = read.history;
      session.#initial = initial.length;
      session.#usage = read.tokens;
    }
    signal?.addEventListener('abort', () => session.#destroy(signal.reason), { once: true });
    return session;
  }

  get contextUsage() { return this.#usage; }
  get contextWindow() { return /** @type {NonNullable<Engine['info']['model']>} */ (this.#engine.info.model).context_length; }
  get inputUsage() { return this.contextUsage; }
  get inputQuota() { return this.contextWindow; }
  get topK() { return this.#topK; }
  get temperature() { return this.#temperature; }

  /**
   * @param {unknown} input
   * @param {LanguageModelPromptOptions} [options]
   * @returns {Promise<string>}
   */
  async prompt(input, options = {}) {
    return this.#enqueue(options.signal, (signal) => this.#respond(input, options, signal, null));
  }

  /**
   * The answer as a stream of the text each token adds (Chrome streams deltas); cancelling the
   * stream aborts the generation.
   * @param {unknown} input
   * @param {LanguageModelPromptOptions} [options]
   * @returns {ReadableStream<string> & AsyncIterable<string>}
   */
  promptStreaming(input, options = {}) {
    const cancel = new AbortController();
    const signal = options.signal ? AbortSignal.any([options.signal, cancel.signal]) : cancel.signal;
    let open = true;
    const stream = new ReadableStream({
      start: (controller) => {
        // Errors (a destroyed session too) error the stream, which is returned at once.
        Promise.resolve().then(() => this.#enqueue(signal, (s) => this.#respond(input, options, s, (delta) => open && controller.enqueue(delta)))).then(
          () => open && controller.close(),
          (e) => open && controller.error(e),
        ).finally(() => (open = false));
      },
      cancel: (reason) => {
        open = false;
        cancel.abort(reason);
      },
    });
    return /** @type {ReadableStream<string> & AsyncIterable<string>} */ (stream);
  }

  /**
   * Adds `input` to the conversation: the engine reads it now (a later prompt reuses it from
   * the KV cache).
   * @param {unknown} input
   * @param {{ signal?: AbortSignal }} [options]
   * @returns {Promise<void>}
   */
  async append(input, options = {}) {
    return this.#enqueue(options.signal, async (signal) => {
      const messages = canonicalPrompt(input, this.#history.length > 0);
      const read = await this.#read(messages, signal, true);
      if ('needed' in read) throw quotaExceeded(read.needed, this.contextWindow);
      signal.throwIfAborted();
      if (read.dropped) this.#overflowed();
      this.#history = read.history;
      this.#usage = read.tokens;
    });
  }

  /**
   * The tokens `input` (with the message showing a responseConstraint, unless omitted) would
   * add to `contextUsage`: the engine's prompt_tokens for the conversation with it, less
   * `contextUsage`.
   * @param {unknown} input
   * @param {LanguageModelPromptOptions} [options]
   * @returns {Promise<number>}
   */
  async measureContextUsage(input, options = {}) {
    const signal = this.#signal(options.signal);
    const rule = constraint(options);
    const messages = [...this.#history, ...canonicalPrompt(input, this.#history.length > 0), ...(rule?.guide ? [rule.guide] : [])];
    const base = this.#usage;
    return untilAborted(this.#count(messages, signal).then((tokens) => tokens - base), signal);
  }

  /**
   * @param {unknown} input
   * @param {LanguageModelPromptOptions} [options]
   */
  measureInputUsage(input, options) {
    return this.measureContextUsage(input, options);
  }

  /**
   * A session with this one's conversation and options, independent from then on.
   * @param {{ signal?: AbortSignal }} [options]
   * @returns {Promise<LanguageModelSession>}
   */
  async clone(options = {}) {
    this.#signal(options.signal);
    // Of this session's class: the one createLanguageModel made for its source.
    const Session = /** @type {typeof LanguageModelSession} */ (this.constructor);
    return new Session(CONSTRUCTING, {
      engine: this.#engine, history: [...this.#history], initial: this.#initial, usage: this.#usage, topK: this.#topK, temperature: this.#temperature,
      maxTokens: this.#maxTokens,
    });
  }

  /** Aborts what runs and what waits; later calls reject with an InvalidStateError. */
  destroy() {
    // Chrome's error (web-platform-tests ai/language-model/language-model-destroy).
    this.#destroy(domError('InvalidStateError', 'The model execution session has been destroyed.'));
  }

  /** @param {DOMException} reason */
  #destroy(reason) {
    if (this.#destroyed) return;
    this.#destroyed = reason;
    this.#destruction.abort(reason);
  }

  /**
   * The signal of an operation: the caller's and the session's destruction; throws where
   * either has fired.
   * @param {AbortSignal | undefined} given
   */
  #signal(given) {
    if (this.#destroyed) throw this.#destroyed;
    const signal = given ? AbortSignal.any([this.#destruction.signal, given]) : this.#destruction.signal;
    signal.throwIfAborted();
    return signal;
  }

  /**
   * Runs `task` after the session's earlier operations; rejects at once when its signal aborts
   * (a running request stops at its next token, and the conversation stays as it was).
   * @template T
   * @param {AbortSignal | undefined} given
   * @param {(signal: AbortSignal) => Promise<T>} task
   * @returns {Promise<T>}
   */
  #enqueue(given, task) {
    const signal = this.#signal(given);
    const run = this.#queue.then(() => {
      signal.throwIfAborted();
      return task(signal);
    });
    this.#queue = run.catch(() => {});
    return untilAborted(run, signal);
  }

  /**
   * `history` without its oldest turn after the initial prompts (its messages up to the next
   * user turn after an answer), or null where only the initial prompts are left.
   * @param {ChatMessage[]} history
   */
  #dropTurn(history) {
    const start = this.#initial;
    if (history.length <= start) return null;
    let end = start;
    while (end < history.length && history[end].role !== 'assistant') end++;
    while (end < history.length && history[end].role === 'assistant') end++;
    return [...history.slice(0, start), ...history.slice(end)];
  }

  /** Fires `contextoverflow` (and `quotaoverflow`, its older name): turns were dropped. */
  #overflowed() {
    this.dispatchEvent(new Event('contextoverflow'));
    this.dispatchEvent(new Event('quotaoverflow'));
  }

  /**
   * The engine's prompt_tokens for `messages`. The engine has no count-only request: one with
   * max_tokens 1 (its minimum) and greedy costs the prompt's prefill (which the next request
   * on this conversation reuses from the KV cache) and one token. A prompt over the context
   * counts as what its `context_overflow` says it needs, less the token it leaves for the answer.
   * @param {ChatMessage[]} messages
   * @param {AbortSignal} signal
   * @returns {Promise<number>}
   */
  async #count(messages, signal) {
    try {
      const out = /** @type {ChatCompletion} */ (await this.#engine.chat.completions.create({ messages, max_tokens: 1, temperature: 0, signal }));
      return out.usage.prompt_tokens;
    } catch (e) {
      const needed = overflowNeeds(e);
      if (needed !== null) return needed - 1;
      throw requestError(e, false);
    }
  }

  /**
   * Has the engine read the conversation with `messages` after it. Where that overflows the
   * context and `evict`, the oldest turns after the initial prompts go until it fits. Resolves
   * to the conversation and its prompt_tokens, or to what it needs where it cannot fit.
   * @param {ChatMessage[]} messages
   * @param {AbortSignal} signal
   * @param {boolean} evict
   * @returns {Promise<{ history: ChatMessage[], tokens: number, dropped: boolean } | { needed: number }>}
   */
  async #read(messages, signal, evict) {
    let history = this.#history;
    let needed = 0;
    for (let dropped = false; ; dropped = true) {
      const tokens = await this.#count([...history, ...messages], signal);
      if (tokens < this.contextWindow) return { history: [...history, ...messages], tokens, dropped };
      needed ||= tokens + 1; // the whole conversation's, as the spec's `requested`
      const shorter = evict ? this.#dropTurn(history) : null;
      if (!shorter) return { needed };
      history = shorter;
    }
  }

  /**
   * Answers `input` after the conversation, streaming each delta to `onDelta`; on success the
   * input and the answer join the conversation. A prompt that overflows the context drops the
   * oldest turns until it fits (or fails with QuotaExceededError).
   * @param {unknown} input
   * @param {LanguageModelPromptOptions} options
   * @param {AbortSignal} signal
   * @param {((delta: string) => void) | null} onDelta
   * @returns {Promise<string>}
   */
  async #respond(input, options, signal, onDelta) {
    const rule = constraint(options);
    const messages = [...canonicalPrompt(input, this.#history.length > 0), ...(rule?.guide ? [rule.guide] : [])];
    let history = this.#history;
    let needed = 0;
    for (let dropped = false; ; dropped = true) {
      let text = '';
      /** @type {string | null} */
      let finish = null;
      let usage = null;
      try {
        const stream = await this.#engine.chat.completions.create({
          messages: [...history, ...messages],
          stream: true,
          signal,
          // The Prompt API samples by topK and temperature alone: the engine's top_p and min_p off.
          temperature: this.#temperature,
          top_k: this.#topK,
          top_p: 1,
          min_p: 0,
          max_tokens: this.#maxTokens ?? this.contextWindow,
          ...rule?.fields,
        });
        for await (const chunk of stream) {
          const delta = chunk.choices[0]?.delta?.content;
          if (delta) {
            text += delta;
            onDelta?.(delta);
          }
          finish = chunk.choices[0]?.finish_reason ?? finish;
          usage = chunk.usage ?? usage;
        }
      } catch (e) {
        const needs = overflowNeeds(e);
        if (needs === null) throw requestError(e, rule !== null);
        needed ||= needs; // the whole conversation's, as the spec's `requested`
        // The prompt does not fit: without the oldest turn, until only the initial prompts are
        // left (then nothing is dropped, as the spec has it).
        const shorter = this.#dropTurn(history);
        if (!shorter) throw quotaExceeded(needed, this.contextWindow);
        history = shorter;
        continue;
      }
      signal.throwIfAborted();
      if (rule && finish === 'length') throw domError('SyntaxError', 'the answer was cut off before it matched the responseConstraint');
      if (!usage) throw domError('UnknownError', 'the engine answered without usage');
      if (dropped) this.#overflowed();
      this.#history = [...history, ...messages, { role: 'assistant', content: text }];
      this.#usage = usage.prompt_tokens + usage.completion_tokens;
      return text;
    }
  }
}


/**
 * A `LanguageModel` class over a Kestrel engine: `source` is `{ engine }` (a loaded engine) or
 * createEngine's options (the engine loads on the first `create()`, which reports its download
 * to `monitor`), with the adapter's own `maxTokens` (most tokens an answer may have; default:
 * until the model stops or the context is full). Each call makes a class of its own, as each
 * source is its own engine.
 * @param {LanguageModelSource} source
 * @returns {LanguageModelConstructor}
 */
export function createLanguageModel(source) {
  const Bound = class LanguageModel extends LanguageModelSession {};
  sources.set(Bound, engineSource(source));
  return Bound;
}

/**
 * Sets `globalThis.LanguageModel` to the adapter where the browser has none, or has one that
 * cannot run here (its `availability()` says 'unavailable': Chrome ships the API where its own model
 * never downloads); resolves to the `LanguageModel` in use. A browser's own that can run (now or
 * after its download) is kept: it needs no download of ours.
 * @param {LanguageModelSource} source
 * @returns {Promise<LanguageModelConstructor>}
 */
export async function installLanguageModel(source) {
  const global = /** @type {{ LanguageModel?: LanguageModelConstructor }} */ (/** @type {unknown} */ (globalThis));
  const own = global.LanguageModel;
  const usable = own !== undefined && (await own.availability().catch(() => 'unavailable')) !== 'unavailable';
  if (!usable) {
    Object.defineProperty(globalThis, 'LanguageModel', { value: createLanguageModel(source), writable: true, configurable: true });
  }
  return /** @type {LanguageModelConstructor} */ (global.LanguageModel);
}
