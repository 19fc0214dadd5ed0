// The remote fall-through: the same requests sent to an OpenAI-compatible server (kestrel serve,
// llama-server, vLLM) when this browser cannot run the model. Only used when the page passes
// `remote` to createEngine; the package makes no other requests. It runs in the engine's worker,
// which writes the answers with the engine core's OpenAI layer (a RemoteAnswer), as for a local
// engine.

/**
 * @import { FinishReason, KestrelDetails, KestrelErrorCode, RemoteOptions, Timings, ToolCall } from './index.d.ts'
 */

import { KestrelError, isKestrelError, kestrelError } from './errors.js';

/**
 * What a generation resolves to, local or remote (kestrel_model::Generation's wire form, with
 * the end-to-end time); `completion_tokens` where the server counted tokens it did not list.
 * @typedef {{
 *   text: string, prompt_token_ids: number[], token_ids: number[], finish_reason: FinishReason,
 *   logprobs: KestrelDetails['logprobs'], timings: Timings, completion_tokens?: number,
 *   tool_calls?: ToolCall[],
 * }} GenerateResult
 */

/**
 * The codes a server may answer with that mean what the package's own do (kestrel serve sends
 * Kestrel's codes; OpenAI's name for a prompt that does not fit is `context_length_exceeded`).
 * @type {Map<string, KestrelErrorCode>}
 */
const SERVER_CODES = new Map([
  ['invalid_option', 'invalid_option'], ['context_overflow', 'context_overflow'], ['context_length_exceeded', 'context_overflow'],
  ['template', 'template'], ['tokenizer', 'tokenizer'], ['bad_model', 'bad_model'], ['out_of_memory', 'out_of_memory'],
  ['device_lost', 'device_lost'],
]);

/**
 * The error an OpenAI-compatible server answered with: under the package's code where the server's
 * means the same (SERVER_CODES), else `remote_error`; `remote` keeps the status and the server's
 * own code (`error.code`, else its type).
 * @param {number} status
 * @param {string} body
 */
function serverError(status, body) {
  let error;
  try {
    error = JSON.parse(body)?.error;
  } catch {
    error = null;
  }
  const serverCode = error?.code ?? error?.type ?? null;
  const code = SERVER_CODES.get(String(serverCode)) ?? 'remote_error';
  return new KestrelError(code, `the remote server answered ${status}: ${error?.message ?? body.slice(0, 200)}`, { remote: { status, code: serverCode == null ? null : String(serverCode) } });
}

/**
 * The `data:` payloads of a server-sent event stream, as they complete.
 * @param {ReadableStream<Uint8Array>} body
 */
async function* sseData(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, '');
        const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (data) yield data;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

/** Runs generation (streamed), embeddings and rerank requests on an OpenAI-compatible server, with per-request abort. */
export class RemoteBackend {
  /** @type {RemoteOptions} */
  #options;
  /** @type {Map<number, AbortController>} */
  #running = new Map();

  /** @param {RemoteOptions} options checked by createEngine */
  constructor(options) {
    this.#options = options;
  }

  get baseURL() {
    return this.#options.baseURL.replace(/\/+$/, '');
  }

  get model() {
    return this.#options.model ?? 'kestrel';
  }

  /**
   * Sends request `id` (`body`: the page's OpenAI-shaped request for `endpoint`, 'chat' or
   * 'completions') as a stream, calling `onToken` per text piece; resolves like the local engine's
   * generation (kestrel_model::Generation's wire form), with finish_reason "abort" when aborted.
   * @param {number} id
   * @param {'chat' | 'completions'} endpoint
   * @param {Record<string, unknown>} body
   * @param {(text: string, tokenId: number | undefined, logprobs: unknown) => void} onToken
   *   `logprobs`: those the server's chunk carried, in OpenAI's shape for the endpoint
   * @param {boolean} aborted aborted before it was sent: it ends at once, with no token
   * @returns {Promise<GenerateResult>}
   */
  async generate(id, endpoint, body, onToken, aborted) {
    const controller = new AbortController();
    if (aborted) controller.abort();
    this.#running.set(id, controller);
    const start = performance.now();
    const chat = endpoint === 'chat';
    const { logprobs, top_logprobs, stream: _stream, ...rest } = body;
    /** @type {Record<string, unknown>} */
    const request = { ...rest, model: this.model, stream: true, stream_options: { include_usage: true } };
    // The package's `logprobs` flag and `top_logprobs` count, as OpenAI's endpoints take them:
    // the same for chat, the count itself for text completions.
    if (logprobs === true || (typeof logprobs === 'number' && logprobs > 0)) {
      const count = typeof logprobs === 'number' ? logprobs : top_logprobs ?? 1;
      if (chat) Object.assign(request, { logprobs: true, top_logprobs: count });
      else request.logprobs = count;
    }
    const headers = this.#headers();
    let text = '';
    /** @type {number[]} */
    const tokenIds = [];
    /** @type {FinishReason | null} */
    let finish = null;
    /** @type {any} */
    let usage = null;
    /** @type {any} */
    let details = null;
    let firstToken = 0;
    /** @type {ToolCall[]} */
    const toolCalls = [];
    try {
      const response = await fetch(`${this.baseURL}/${chat ? 'chat/completions' : 'completions'}`, {
        method: 'POST', headers, body: JSON.stringify(request), signal: controller.signal,
      });
      if (!response.ok || !response.body) throw serverError(response.status, await response.text());
      for await (const data of sseData(response.body)) {
        if (data === '[DONE]') break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw serverError(200, JSON.stringify(chunk));
        if (chunk.usage) usage = chunk.usage;
        if (chunk.kestrel) details = chunk.kestrel;
        const choice = chunk.choices?.[0];
        if (!choice) continue;
        const piece = chat ? choice.delta?.content : choice.text;
        const tokenId = typeof choice.token_id === 'number' ? choice.token_id : undefined;
        if (tokenId !== undefined) tokenIds.push(tokenId);
        // Every token streams, one whose text is held back (empty) too, as a local engine's do.
        if (piece || tokenId !== undefined) {
          firstToken ||= performance.now();
          text += piece ?? '';
          onToken(piece ?? '', tokenId, choice.logprobs);
        }
        // A call may come in pieces of one index: its id, type and name once, its arguments in parts.
        for (const delta of (chat && choice.delta?.tool_calls) || []) {
          const call = (toolCalls[delta.index ?? toolCalls.length] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
          if (delta.id) call.id = delta.id;
          if (delta.function?.name) call.function.name += delta.function.name;
          if (delta.function?.arguments) call.function.arguments += delta.function.arguments;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    } catch (e) {
      if (!controller.signal.aborted) {
        throw isKestrelError(e) ? e : kestrelError('remote_error', `the remote server could not be reached: ${/** @type {Error} */ (e).message}`);
      }
      finish = 'abort';
    } finally {
      this.#running.delete(id);
    }
    if (controller.signal.aborted) finish = 'abort';
    if (!finish) throw kestrelError('remote_error', 'the remote server ended the stream without a finish reason');
    const end = performance.now();
    const promptTokens = usage?.prompt_tokens ?? details?.prompt_token_ids?.length ?? 0;
    const completionTokens = usage?.completion_tokens ?? details?.token_ids?.length ?? tokenIds.length;
    const ttft = (firstToken || end) - start;
    /** @type {Timings} */
    const timings = details?.timings ?? {
      prompt_tokens: promptTokens, prefill_tokens: promptTokens, reused_tokens: 0, ttft_ms: ttft,
      prefill_tok_s: promptTokens / Math.max(ttft / 1e3, 1e-9), decode_tokens: Math.max(completionTokens - 1, 0),
      decode_ms: end - (firstToken || end), decode_tok_s: completionTokens > 1 ? (completionTokens - 1) / Math.max((end - firstToken) / 1e3, 1e-9) : 0,
      host_wait_ms_per_token: 0, prefill_submissions: null, longest_prefill_submission_ms: null,
    };
    timings.e2e_ms = end - start;
    return {
      text,
      prompt_token_ids: details?.prompt_token_ids ?? [],
      token_ids: details?.token_ids ?? tokenIds,
      finish_reason: finish,
      logprobs: details?.logprobs ?? [],
      timings,
      completion_tokens: completionTokens,
      ...(toolCalls.length ? { tool_calls: toolCalls.filter(Boolean) } : {}),
    };
  }

  /**
   * Sends embeddings request `id` (`body`: the page's `embeddings.create` argument, checked) to
   * the server's /embeddings and resolves to its answer, OpenAI's shape as the local engine's;
   * null when aborted (`aborted`: before it was sent, so it is not).
   * @param {number} id
   * @param {Record<string, unknown>} body
   * @param {boolean} aborted
   * @returns {Promise<unknown>}
   */
  embed(id, body, aborted) {
    return this.#post(id, 'embeddings', body, aborted, (answer) => Array.isArray(answer?.data), "OpenAI's list");
  }

  /**
   * Sends rerank request `id` (`body`: the page's `rerank` argument, checked) to the server's
   * /rerank and resolves to its answer, the local engine's shape (llama.cpp server's, Jina's and
   * Cohere's); null when aborted, as `embed`.
   * @param {number} id
   * @param {Record<string, unknown>} body
   * @param {boolean} aborted
   * @returns {Promise<unknown>}
   */
  rerank(id, body, aborted) {
    return this.#post(id, 'rerank', body, aborted, (answer) => Array.isArray(answer?.results), 'a list of results');
  }

  /**
   * POSTs `body` (with the engine's `model`) to the server's `/path`; its JSON answer where it is
   * an `object: 'list'` that `valid` accepts (`shape` names what was expected), null when aborted.
   * @param {number} id
   * @param {string} path
   * @param {Record<string, unknown>} body
   * @param {boolean} aborted
   * @param {(answer: any) => boolean} valid
   * @param {string} shape
   * @returns {Promise<unknown>}
   */
  async #post(id, path, body, aborted, valid, shape) {
    if (aborted) return null;
    const controller = new AbortController();
    this.#running.set(id, controller);
    try {
      const response = await fetch(`${this.baseURL}/${path}`, {
        method: 'POST', headers: this.#headers(), body: JSON.stringify({ ...body, model: this.model }), signal: controller.signal,
      });
      const text = await response.text();
      if (!response.ok) throw serverError(response.status, text);
      let answer = null;
      try {
        answer = JSON.parse(text);
      } catch {
        // Not JSON: refused below with the start of what came.
      }
      if (answer?.object !== 'list' || !valid(answer)) {
        throw kestrelError('remote_error', `the remote server's ${path} answer is not ${shape}: ${text.slice(0, 200)}`);
      }
      return answer;
    } catch (e) {
      if (controller.signal.aborted) return null;
      throw isKestrelError(e) ? e : kestrelError('remote_error', `the remote server could not be reached: ${/** @type {Error} */ (e).message}`);
    } finally {
      this.#running.delete(id);
    }
  }

  /** The request headers: JSON, and the API key where there is one. */
  #headers() {
    /** @type {Record<string, string>} */
    const headers = { 'Content-Type': 'application/json' };
    if (this.#options.apiKey) headers.Authorization = `Bearer ${this.#options.apiKey}`;
    return headers;
  }

  /**
   * Whether request `id` has been sent and not ended.
   * @param {number} id
   */
  isRunning(id) {
    return this.#running.has(id);
  }

  /** @param {number} id */
  abort(id) {
    this.#running.get(id)?.abort();
  }

  abortAll() {
    for (const controller of this.#running.values()) controller.abort();
  }
}
