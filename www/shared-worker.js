// The shared engine (createEngine({ shared: true })): one engine for every tab of an origin that
// loads the same model with the same options. It runs as a SharedWorker, each tab a MessagePort;
// where the browser has no SharedWorker, as the dedicated worker of the tab that leads (index.js's
// shared.js elects it with Web Locks), its own page through its port and the other tabs through a
// BroadcastChannel. Either way this hub makes the tabs' request ids unique before they reach the
// engine (engine-host.js), routes every answer back to the tab that asked, loads the model once
// for all of them, and ends the requests of a tab that goes away. When the engine crashes, this
// worker closes itself, and the tabs reach a new one (shared.js).

/**
 * @import { EngineInfo } from './index.d.ts'
 * @import { ChannelMessage, ErrorReply, HelloMessage, HostReply, HubRequest, LeadMessage, Reply, EngineRequest, WireError } from './protocol.d.ts'
 */

import { EngineHost } from './engine-host.js';

/**
 * This worker's id: it holds the Web Lock `kestrel-engine-alive:<id>` while it lives, so that
 * the tabs know when a crashed one is gone.
 */
const instance = crypto.randomUUID();
navigator.locks.request(`kestrel-engine-alive:${instance}`, () => new Promise(() => {}));

/**
 * A connected tab: `send` posts to it; `ids` maps the hub's ids of its live requests to its own;
 * `rejoining`: the tab lost the leader before this one, and waits for the model's reload.
 * @typedef {{ send: (msg: Reply) => void, ids: Map<number, number>, generations: Set<number>, gone: boolean, rejoining: boolean }} Client
 */

/**
 * The model's one load: its hub id, the clients waiting for its answer, and once loaded its info
 * (a later tab's load answers with it); `takeover`: a new leader's reload of the old leader's
 * model (asked by a tab that lost the old leader).
 * @typedef {{ id: number, waiting: { client: Client, id: number }[], info: EngineInfo | null, done: Promise<void>, settle: () => void, takeover: boolean }} Load
 */

/**
 * The hub: the tabs connected to this worker, the engine they share (an EngineHost), and which
 * tab each of the engine's requests answers.
 */
class Hub {
  /** @type {Set<Client>} */
  #clients = new Set();
  /** Hub id -> the client and its own id, while the request lives. */
  /** @type {Map<number, { client: Client, id: number }>} */
  #routes = new Map();
  #nextId = 1;
  /** Requests ended because their tab went away (engine.info.shared.abandoned_requests). */
  #abandoned = 0;
  /** The model's one load: null before the first load and after the last tab leaves. */
  /** @type {Load | null} */
  #load = null;
  #host = new EngineHost((msg) => this.#route(msg));
  /** This worker's id, which a crash's status names. */
  #instance;

  /** @param {string} instance this worker's id */
  constructor(instance) {
    this.#instance = instance;
  }

  /**
   * Where the engine's messages go: a status to every tab, the load's to every tab waiting for it,
   * the others to the tab that asked, under its own id.
   * @param {HostReply} msg
   */
  #route(msg) {
    if (msg.id === undefined) {
      // A status (device loss, recovery, a crash): every tab's.
      const status = msg.status === 'crashed' ? { ...msg, engine: this.#instance } : msg;
      for (const c of this.#clients) c.send(status);
      // A crashed engine never runs again (engine-host.js): once this worker is gone, a tab that
      // connects starts a new one.
      if (msg.status === 'crashed') self.close();
      return;
    }
    if (this.#load && msg.id === this.#load.id) {
      this.#answerLoad(this.#load, msg);
      return;
    }
    const to = this.#routes.get(msg.id);
    if (!to) return;
    const final = msg.type === 'result' || msg.type === 'error';
    if (final) {
      this.#routes.delete(msg.id);
      to.client.ids.delete(msg.id);
      to.client.generations.delete(msg.id);
    }
    if (!to.client.gone) to.client.send({ ...msg, id: to.id });
  }

  /**
   * The load's progress and answer go to every tab that asked for the model while it loaded.
   * @param {Load} current the load `msg` is of
   * @param {Exclude<HostReply, { type: 'status' }>} msg
   */
  #answerLoad(current, msg) {
    for (const w of current.waiting) if (!w.client.gone) w.client.send({ ...msg, id: w.id });
    if (msg.type !== 'result' && msg.type !== 'error') return;
    current.waiting = [];
    // A load answers with the engine's info.
    if (msg.type === 'result') current.info = /** @type {EngineInfo} */ (msg.value);
    else this.#load = null; // a failed load is tried again by the next tab that asks
    if (current.takeover) {
      const outcome = current.info ? { info: current.info } : { error: /** @type {ErrorReply} */ (msg).error };
      for (const c of this.#clients) if (c.rejoining) tellReloaded(c, outcome);
    }
    current.settle();
  }

  #announceClients() {
    for (const c of this.#clients) c.send({ type: 'clients', clients: this.#clients.size, abandoned_requests: this.#abandoned });
  }

  /**
   * A new tab. `lock` names the Web Lock it holds while it lives: granted to the hub, it means the tab
   * closed or navigated away, and its requests end. `rejoining`: it lost the old leader, and hears
   * when this leader's reload is done (at once if it already is).
   * @param {(msg: Reply) => void} send
   * @param {string | undefined} lock
   * @param {boolean} rejoining
   */
  connect(send, lock, rejoining) {
    /** @type {Client} */
    const client = { send, ids: new Map(), generations: new Set(), gone: false, rejoining };
    this.#clients.add(client);
    if (lock && globalThis.navigator?.locks) navigator.locks.request(lock, () => this.#leave(client));
    this.#announceClients();
    if (rejoining && this.#load?.takeover && this.#load.info) tellReloaded(client, { info: this.#load.info });
    return client;
  }

  /**
   * A tab that left (closed, navigated, or unloaded its engine): its requests end, nothing else.
   * @param {Client} client
   */
  #leave(client) {
    if (client.gone) return;
    client.gone = true;
    this.#clients.delete(client);
    for (const id of client.generations) {
      this.#abandoned++;
      this.#host.handleMessage({ type: 'abort', id });
    }
    if (this.#load) this.#load.waiting = this.#load.waiting.filter((w) => w.client !== client);
    if (this.#clients.size === 0 && this.#load) {
      // The last tab: the model's memory goes back; a later tab loads it again (from the Cache API).
      this.#load = null;
      this.#host.handleMessage({ type: 'unload', id: this.#nextId++ });
    }
    this.#announceClients();
  }

  /**
   * One message of `client`. A load joins the model's one load; an unload detaches the tab; every
   * other message reaches the engine under a hub id, after the load.
   * @param {Client} client
   * @param {Exclude<HubRequest, HelloMessage>} msg
   */
  async receive(client, msg) {
    if (client.gone) return;
    if (msg.type === 'bye' || msg.type === 'unload') {
      if (msg.type === 'unload') client.send({ type: 'result', id: msg.id, value: null });
      this.#leave(client);
      return;
    }
    const { type, id } = msg;
    if (type === 'abort') {
      for (const [hubId, own] of client.ids) if (own === id) this.#host.handleMessage({ type: 'abort', id: hubId });
      return;
    }
    if (type === 'load') {
      if (this.#load?.info) {
        client.send({ type: 'progress', id, progress: { phase: 'ready', loaded: 0, total: 0 } });
        client.send({ type: 'result', id, value: this.#load.info });
        return;
      }
      if (this.#load) {
        this.#load.waiting.push({ client, id });
        return;
      }
      /** @type {() => void} */
      let settle = () => {};
      const done = new Promise((resolve) => (settle = () => resolve(undefined)));
      this.#load = { id: this.#nextId++, waiting: [{ client, id }], info: null, done, settle, takeover: client.rejoining };
      this.#host.handleMessage({ ...msg, id: this.#load.id });
      return;
    }
    // Requests wait for the model (a tab may ask while another tab's load of it runs).
    if (this.#load && !this.#load.info && type !== 'estimate') await this.#load.done;
    if (client.gone) return;
    const hubId = this.#nextId++;
    this.#routes.set(hubId, { client, id });
    client.ids.set(hubId, id);
    if (type === 'generate') client.generations.add(hubId);
    this.#host.handleMessage({ ...msg, id: hubId });
  }
}

/**
 * Tells a tab that lost the old leader how the new leader's reload ended, as a status (index.js's
 * onStatus: 'ready' with the engine's info, or 'failed' with the error).
 * @param {Client} client
 * @param {{ info: EngineInfo } | { error: WireError }} outcome the load's
 */
function tellReloaded(client, outcome) {
  client.rejoining = false;
  client.send('info' in outcome ? { type: 'status', status: 'ready', info: outcome.info } : { type: 'status', status: 'failed', error: outcome.error });
}

const hub = new Hub(instance);

if (typeof self.SharedWorkerGlobalScope === 'function' && self instanceof self.SharedWorkerGlobalScope) {
  // A SharedWorker: every tab connects a port and says hello with its lock first.
  self.addEventListener('connect', (/** @type {MessageEvent} */ e) => {
    const port = e.ports[0];
    /** @type {Client | null} */
    let client = null;
    port.onmessage = (/** @type {MessageEvent<HubRequest>} */ { data }) => {
      if (data.type === 'hello') client ??= hub.connect((m) => port.postMessage(m), data.lock, false);
      else if (client) hub.receive(client, data);
    };
  });
} else {
  // The leading tab's dedicated worker: its page through `self`, the other tabs through the
  // BroadcastChannel its page names ('lead').
  /** @type {Client | null} */
  let own = null;
  self.onmessage = (/** @type {MessageEvent<LeadMessage | EngineRequest>} */ { data }) => {
    if (data.type === 'lead') {
      own = hub.connect((m) => self.postMessage(m), undefined, data.rejoin === true);
      serveChannel(data.channel, data.leader);
    } else if (own) {
      hub.receive(own, data);
    }
  };
}

/**
 * Serves the following tabs over BroadcastChannel `name`: each message carries the tab's id
 * (`from`, or `to` on the way back). Announces the new leader first, so that tabs whose requests
 * ran on a leader that closed fail them (`leader_lost`) and say hello again.
 * @param {string} name
 * @param {string} leader this leader's id
 */
function serveChannel(name, leader) {
  const channel = new BroadcastChannel(name);
  /** @type {Map<string, Client>} */
  const followers = new Map();
  // Every tab's messages cross this channel: the leader reads those to it.
  channel.onmessage = (/** @type {MessageEvent<ChannelMessage>} */ { data }) => {
    if (data?.to !== 'leader' || !('from' in data) || typeof data.from !== 'string') return;
    const { from, msg } = data;
    if (msg?.type === 'hello') {
      // Welcomed first: the tab takes this leader's messages from then on, the count of tabs too.
      channel.postMessage({ to: from, leader, msg: { type: 'welcome' } });
      if (!followers.has(from)) {
        followers.set(from, hub.connect((m) => channel.postMessage({ to: from, leader, msg: m }), msg.lock, msg.rejoin === true));
      }
      return;
    }
    const client = followers.get(from);
    if (client) hub.receive(client, msg);
  };
  channel.postMessage({ to: '*', leader, msg: { type: 'leader' } });
}
