// The engine a worker hosts: the wasm Engine (local-engine.js), or for a remote engine the
// connection to its server (remote-engine.js), behind one interface (EngineBackend). Its clients
// talk to it with the messages of protocol.d.ts through `handleMessage`; it answers with
// 'progress', 'token' (a streamed chunk), 'result' and 'error' messages, and reports 'status' (a
// device loss and the recovery from it, a crash) to every client, through the function it is
// made with. worker.js hosts it for one page; shared-worker.js for every tab of an origin. The
// engine core (kestrel-engine, in the wasm module) schedules the requests and writes their
// answers in OpenAI's shape; the host carries its events. The page (index.js) queues requests,
// except those the engine runs at once (`runsAtOnce`: generations on an engine that batches them,
// `info.model.batched`, and every request to a server): those come at once. A trap of the wasm
// instance (a Rust panic, a stack overflow, an allocation failure) ends the engine for good:
// every call fails with `internal`, and the status 'crashed' tells the clients, whose page
// replaces this worker with a new one.

/**
 * @import { HostReply, EngineRequest } from './protocol.d.ts'
 */

import { errorOf, isTrap } from './engine-shared.js';
import { kestrelError } from './errors.js';
import { gpuBuffers } from './gpu-buffers.js';
import { LocalEngine } from './local-engine.js';
import { DescribedAdapter, estimate } from './model-files.js';
import { RemoteEngine } from './remote-engine.js';
import { initWasm, reportPanicsTo } from './wasm.js';

/**
 * What the host runs requests on: the wasm engine (LocalEngine) or a server (RemoteEngine).
 * `abortedEarly`: the request's abort came before it.
 * @typedef {{
 *   runsAtOnce(type: 'generate' | 'embed' | 'rerank'): boolean,
 *   before(type: EngineRequest['type']): Promise<void>,
 *   generate(id: number, endpoint: 'chat' | 'completions', body: Record<string, unknown>, abortedEarly: boolean): Promise<unknown>,
 *   encode(type: 'embed' | 'rerank', id: number, body: Record<string, unknown>, abortedEarly: boolean): Promise<unknown>,
 *   abort(id: number): boolean,
 *   reset(): Promise<void>,
 *   unload(): void,
 * }} EngineBackend
 * `runsAtOnce`: whether a request of `type` starts at once, beside the queue of the others;
 * `before`: resolves once a queued request of `type` may start; `abort`: stops running request
 * `id` (false where none runs: its abort came first).
 */

/**
 * What an engine reaches of its host: where its messages go, and the error a failed call reports
 * (the crash's once the engine crashed).
 * @typedef {{ post: (msg: HostReply) => void, callError: (e: unknown) => unknown }} HostLink
 */

export class EngineHost {
  /** @type {(msg: HostReply) => void} */
  #post;
  #adapter = new DescribedAdapter();
  /** @type {LocalEngine} */
  #local;
  /** The engine requests run on: the local one, or once connected the remote one. */
  /** @type {EngineBackend} */
  #engine;
  /** The wasm instance's memory, once initialised. */
  /** @type {Promise<WebAssembly.Memory> | null} */
  #wasm = null;
  /** @type {WebAssembly.Memory | null} */
  #memory = null;
  /** Page ids aborted before their request reached the engine. */
  /** @type {Set<number>} */
  #aborted = new Set();
  /** The error every call fails with once the engine crashed (`#crashWith`). */
  /** @type {Error | null} */
  #crash = null;

  /** @param {(msg: HostReply) => void} post where the host's messages go (worker.js: its page; shared-worker.js: the client they answer) */
  constructor(post) {
    this.#post = post;
    /** @type {HostLink} */
    const link = { post, callError: (e) => this.#callError(e) };
    this.#local = new LocalEngine(link, this.#adapter);
    this.#engine = this.#local;
    // A trap in a future that the wasm polls from a microtask (a step, a load's compile, an
    // embedding) reaches no call: its promise never settles, and the trap is this worker's uncaught
    // error, kept here from the page's `onerror` (which would close the engine for good). After a
    // crash, so are the dead instance's other errors.
    self.addEventListener('error', (event) => {
      if (!this.#crash && !isTrap(event.error)) return;
      event.preventDefault();
      this.#callError(event.error);
    });
    self.addEventListener('unhandledrejection', (event) => {
      if (!this.#crash && !isTrap(event.reason)) return;
      event.preventDefault();
      this.#callError(event.reason);
    });
  }

  /** Initialises the wasm module once (a failed start is tried again by the next call). */
  #initWasm() {
    this.#wasm ??= initWasm().then((memory) => {
      this.#memory = memory;
      // A panic aborts (wasm is built with panic=abort) with a bare `RuntimeError: unreachable`:
      // its message, reported just before, says why.
      reportPanicsTo((message) => this.#crashWith('RuntimeError: unreachable', message));
      return memory;
    }, (e) => {
      this.#wasm = null;
      throw e;
    });
    return this.#wasm;
  }

  /**
   * Records the engine's crash, once, and tells every client ('crashed'). After a trap the
   * instance's Rust state is undefined (RefCells left borrowed, structures half written), and
   * wasm-bindgen instantiates its module once per realm: nothing here can run the engine again, so
   * every call fails with the crash's error and the page replaces this worker with a new one that
   * reloads the model (index.js). `trap`: what the instance threw; `panic`: the panic behind it.
   * @param {string} trap
   * @param {string} [panic]
   */
  #crashWith(trap, panic) {
    if (!this.#crash) {
      this.#crash = kestrelError('internal', `the engine crashed (${trap}${panic ? `: ${panic}` : ''}); it restarts in a new worker and reloads the model`);
      this.#post({ type: 'status', status: 'crashed', error: errorOf(this.#crash) });
    }
    return this.#crash;
  }

  /**
   * The error a call fails with: `e`, or the crash's once the engine crashed (`e` may then be what
   * a later use of the dead instance threw, such as wasm-bindgen's "recursive use of an object").
   * @param {unknown} e
   */
  #callError(e) {
    if (this.#crash) return this.#crash;
    return isTrap(e) ? this.#crashWith(`${/** @type {Error} */ (e).name}: ${/** @type {Error} */ (e).message}`) : e;
  }

  /**
   * Handles one message of a client: a request, or the abort of one.
   * @param {EngineRequest} msg
   */
  handleMessage(msg) {
    if (this.#crash) {
      // The page replaces this worker; until it does, every call fails with the crash.
      if (msg.type !== 'abort') this.#post({ type: 'error', id: msg.id, error: errorOf(this.#crash) });
      return;
    }
    if (msg.type === 'abort') {
      if (!this.#engine.abort(msg.id)) this.#aborted.add(msg.id);
      return;
    }
    const atOnce = (msg.type === 'generate' || msg.type === 'embed' || msg.type === 'rerank') && this.#engine.runsAtOnce(msg.type);
    this.#answer(msg.id, async () => {
      if (!atOnce) await this.#engine.before(msg.type);
      return this.#run(msg);
    });
  }

  /**
   * Posts the answer of request `id`: what `run` resolves to, or its error.
   * @param {number} id
   * @param {() => Promise<unknown>} run
   */
  async #answer(id, run) {
    try {
      this.#post({ type: 'result', id, value: await run() });
    } catch (e) {
      this.#post({ type: 'error', id, error: errorOf(this.#callError(e)) });
    }
  }

  /**
   * Runs request `msg`: resolves to its answer's value.
   * @param {Exclude<EngineRequest, { type: 'abort' }>} msg
   * @returns {Promise<unknown>}
   */
  async #run(msg) {
    switch (msg.type) {
      case 'load':
        await this.#initWasm();
        return this.#local.load(msg);
      case 'connect':
        // A remote engine: its requests go to this OpenAI-compatible server.
        this.#engine = new RemoteEngine(msg.remote, this.#post);
        await this.#initWasm();
        return undefined;
      case 'generate':
        return this.#engine.generate(msg.id, msg.endpoint, msg.body, this.#aborted.delete(msg.id));
      case 'embed':
      case 'rerank':
        return this.#engine.encode(msg.type, msg.id, msg.body, this.#aborted.delete(msg.id));
      case 'reset':
        return this.#engine.reset();
      case 'unload':
        this.#engine.unload();
        return undefined;
      case 'estimate':
        await this.#initWasm();
        return estimate(msg.model, msg, this.#adapter, { draft: msg.draftModel });
      case 'flush':
        // Answered once the save after the last request has ended (`before`).
        return undefined;
      case 'memory':
        return { wasm_bytes: this.#memory?.buffer.byteLength ?? 0, gpu_buffers: gpuBuffers.count, gpu_buffer_bytes: gpuBuffers.bytes };
      case 'destroy-device':
        // The test hook of the recovery: loses the device as a driver reset would.
        this.#local.destroyDevice();
        return undefined;
      case 'trap':
        // The test hook of the crash recovery.
        return this.#local.trap(msg.how);
      default:
        throw kestrelError('internal', `unknown message ${/** @type {{ type: string }} */ (msg).type}`);
    }
  }
}
