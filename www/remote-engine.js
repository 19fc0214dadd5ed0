// A remote engine (createEngine's `remote`): the requests go to an OpenAI-compatible server
// (remote.js), checked first as a local engine would check them, and the answers are written by
// the same engine core as a local one's (a RemoteAnswer of the wasm module).

/**
 * @import { RemoteOptions } from './index.d.ts'
 * @import { HostReply } from './protocol.d.ts'
 * @import { EngineBackend } from './engine-host.js'
 */

import { requestJson } from './engine-shared.js';
import { RemoteBackend } from './remote.js';
import { RemoteAnswer, checkEmbeddingRequest, checkRerankRequest } from './wasm.js';

/** @implements {EngineBackend} */
export class RemoteEngine {
  /** @type {RemoteBackend} */
  #server;
  /** @type {(msg: HostReply) => void} */
  #post;

  /**
   * @param {RemoteOptions} options
   * @param {(msg: HostReply) => void} post
   */
  constructor(options, post) {
    this.#server = new RemoteBackend(options);
    this.#post = post;
  }

  /** Every request goes to the server at once: it queues them itself. */
  runsAtOnce() {
    return true;
  }

  /** Nothing to wait for: no device to lose, no prefix to save. */
  async before() {}

  /**
   * A generation: checked as a local engine would check it, sent to the server, and its answer
   * written by the same engine core as a local one's.
   * @param {number} id
   * @param {'chat' | 'completions'} endpoint
   * @param {Record<string, unknown>} body
   * @param {boolean} abortedEarly its abort came before it: it ends at once, with no token
   */
  async generate(id, endpoint, body, abortedEarly) {
    const answer = new RemoteAnswer(id, endpoint, requestJson(body), this.#server.model);
    try {
      /** @type {(text: string, tokenId: number | undefined, logprobs: unknown) => void} */
      const onToken = (text, tokenId, logprobs) => {
        for (const e of answer.token(text, tokenId, logprobs ? JSON.stringify(logprobs) : undefined)) {
          if (e.chunk) this.#post({ type: 'token', id, chunk: e.chunk });
        }
      };
      const result = await this.#server.generate(id, endpoint, body, onToken, abortedEarly);
      let value = null;
      for (const e of answer.done(JSON.stringify(result), result.completion_tokens)) {
        if (e.chunk) this.#post({ type: 'token', id, chunk: e.chunk });
        else value = e.result;
      }
      return value;
    } finally {
      answer.free();
    }
  }

  /**
   * Embeddings or rerank: checked as a local engine would check them, then sent to the server's
   * /embeddings or /rerank; null when aborted (the page has stopped waiting).
   * @param {'embed' | 'rerank'} type
   * @param {number} id
   * @param {Record<string, unknown>} body
   * @param {boolean} abortedEarly
   */
  async encode(type, id, body, abortedEarly) {
    (type === 'embed' ? checkEmbeddingRequest : checkRerankRequest)(JSON.stringify(body));
    return type === 'embed' ? this.#server.embed(id, body, abortedEarly) : this.#server.rerank(id, body, abortedEarly);
  }

  /** @param {number} id */
  abort(id) {
    if (!this.#server.isRunning(id)) return false;
    this.#server.abort(id);
    return true;
  }

  /** A server keeps no conversation of this engine's to forget. */
  async reset() {}

  /** The requests in flight end (aborted). */
  unload() {
    this.#server.abortAll();
  }
}
