// The shared engine (createEngine({ shared: true })): one engine for every tab of an origin that
// loads the same model with the same options. It runs as a SharedWorker, each tab a MessagePort;
// where the browser has no SharedWorker, as the dedicated worker of the tab that leads (index.js's
// shared.js elects it with Web Locks), its own page through its port and the other tabs through a
// BroadcastChannel. Either way this hub makes the tabs' request ids unique before they reach the
// engine (engine-host.js), routes every answer back to the tab that asked, loads the model once
// for all of them, and ends the requests of a tab that goes away. When the engine crashes, this
// worker closes itself, and the tabs reach a new one (shared.js).
import { handleMessage, setOutbound } from './engine-host.js';

/**
 * This worker's id: it holds the Web Lock `kestrel-engine-alive:<id>` while it lives, so that
 * the tabs know when a crashed one is gone.
 */
const instance = crypto.randomUUID();
navigator.locks.request(`kestrel-engine-alive:${instance}`, () => new Promise(() => {}));

/**
 * A connected tab: `send` posts to it; `ids` maps the hub's ids of its live requests to its own;
 * `rejoining`: the tab lost the leader before this one, and waits for the model's reload.
 * @typedef {{ send: (msg: any) => void, ids: Map<number, number>, generations: Set<number>, gone: boolean, rejoining: boolean }} Client
 */

/** @type {Set<Client>} */
const clients = new Set();
/** Hub id -> the client and its own id, while the request lives. */
const routes = new Map();
let nextId = 1;
/** Requests ended because their tab went away (engine.info.shared.abandoned_requests). */
let abandoned = 0;

/**
 * The model's one load: its hub id, the clients waiting for its answer, and once loaded its info
 * (a later tab's load answers with it); `takeover`: a new leader's reload of the old leader's
 * model (asked by a tab that lost the old leader). Null before the first load and after the last tab leaves.
 * @type {{ id: number, waiting: { client: Client, id: number }[], info: any, done: Promise<void>, settle: () => void, takeover: boolean } | null}
 */
let load = null;

setOutbound((msg) => {
  if (msg.id === undefined) {
    // A status (device loss, recovery, a crash): every tab's.
    const status = msg.status === 'crashed' ? { ...msg, engine: instance } : msg;
    for (const c of clients) c.send(status);
    // A crashed engine never runs again (engine-host.js): once this worker is gone, a tab that
    // connects starts a new one.
    if (msg.status === 'crashed') self.close();
    return;
  }
  if (load && msg.id === load.id) {
    answerLoad(msg);
    return;
  }
  const route = routes.get(msg.id);
  if (!route) return;
  const final = msg.type === 'result' || msg.type === 'error';
  if (final) {
    routes.delete(msg.id);
    route.client.ids.delete(msg.id);
    route.client.generations.delete(msg.id);
  }
  if (!route.client.gone) route.client.send({ ...msg, id: route.id });
});

/** The load's progress and answer go to every tab that asked for the model while it loaded. */
function answerLoad(msg) {
  const current = /** @type {NonNullable<typeof load>} */ (load);
  for (const w of current.waiting) if (!w.client.gone) w.client.send({ ...msg, id: w.id });
  if (msg.type === 'progress') return;
  current.waiting = [];
  if (msg.type === 'result') current.info = msg.value;
  else load = null; // a failed load is tried again by the next tab that asks
  if (current.takeover) {
    for (const c of clients) if (c.rejoining) tellReloaded(c, msg);
  }
  current.settle();
}

/**
 * Tells a tab that lost the old leader how the new leader's reload ended, as a status (index.js's
 * onStatus: 'ready' with the engine's info, or 'failed' with the error).
 * @param {Client} client
 * @param {any} answer the load's 'result' or 'error'
 */
function tellReloaded(client, answer) {
  client.rejoining = false;
  client.send(answer.type === 'result' ? { type: 'status', status: 'ready', info: answer.value } : { type: 'status', status: 'failed', error: answer.error });
}

function announceClients() {
  for (const c of clients) c.send({ type: 'clients', clients: clients.size, abandoned_requests: abandoned });
}

/**
 * A new tab. `lock` names the Web Lock it holds while it lives: granted to the hub, it means the tab
 * closed or navigated away, and its requests end. `rejoining`: it lost the old leader, and hears
 * when this leader's reload is done (at once if it already is).
 * @param {(msg: any) => void} send
 * @param {string | undefined} lock
 * @param {boolean} rejoining
 */
function connect(send, lock, rejoining) {
  /** @type {Client} */
  const client = { send, ids: new Map(), generations: new Set(), gone: false, rejoining };
  clients.add(client);
  if (lock && globalThis.navigator?.locks) navigator.locks.request(lock, () => leave(client));
  announceClients();
  if (rejoining && load?.takeover && load.info) tellReloaded(client, { type: 'result', value: load.info });
  return client;
}

/** A tab that left (closed, navigated, or unloaded its engine): its requests end, nothing else. */
function leave(client) {
  if (client.gone) return;
  client.gone = true;
  clients.delete(client);
  for (const id of client.generations) {
    abandoned++;
    handleMessage({ type: 'abort', id });
  }
  if (load) load.waiting = load.waiting.filter((w) => w.client !== client);
  if (clients.size === 0 && load) {
    // The last tab: the model's memory goes back; a later tab loads it again (from the Cache API).
    load = null;
    handleMessage({ type: 'unload', id: nextId++ });
  }
  announceClients();
}

/**
 * One message of `client`. A load joins the model's one load; an unload detaches the tab; every
 * other message reaches the engine under a hub id, after the load.
 * @param {Client} client
 * @param {any} msg
 */
async function receive(client, msg) {
  if (client.gone) return;
  const { type, id } = msg;
  if (type === 'bye' || type === 'unload') {
    if (type === 'unload') client.send({ type: 'result', id, value: null });
    leave(client);
    return;
  }
  if (type === 'abort') {
    for (const [hubId, own] of client.ids) if (own === id) handleMessage({ type: 'abort', id: hubId });
    return;
  }
  if (type === 'load') {
    if (load?.info) {
      client.send({ type: 'progress', id, progress: { phase: 'ready', loaded: 0, total: 0 } });
      client.send({ type: 'result', id, value: load.info });
      return;
    }
    if (load) {
      load.waiting.push({ client, id });
      return;
    }
    /** @type {() => void} */
    let settle = () => {};
    const done = new Promise((resolve) => (settle = () => resolve(undefined)));
    load = { id: nextId++, waiting: [{ client, id }], info: null, done, settle, takeover: client.rejoining };
    handleMessage({ ...msg, id: load.id });
    return;
  }
  // Requests wait for the model (a tab may ask while another tab's load of it runs).
  if (load && !load.info && type !== 'estimate') await load.done;
  if (client.gone) return;
  const hubId = nextId++;
  routes.set(hubId, { client, id });
  client.ids.set(hubId, id);
  if (type === 'generate') client.generations.add(hubId);
  handleMessage({ ...msg, id: hubId });
}

if (typeof self.SharedWorkerGlobalScope === 'function' && self instanceof self.SharedWorkerGlobalScope) {
  // A SharedWorker: every tab connects a port and says hello with its lock first.
  self.addEventListener('connect', (/** @type {MessageEvent} */ e) => {
    const port = e.ports[0];
    /** @type {Client | null} */
    let client = null;
    port.onmessage = ({ data }) => {
      if (data.type === 'hello') client ??= connect((m) => port.postMessage(m), data.lock, false);
      else if (client) receive(client, data);
    };
  });
} else {
  // The leading tab's dedicated worker: its page through `self`, the other tabs through the
  // BroadcastChannel its page names ('lead').
  /** @type {Client | null} */
  let own = null;
  self.onmessage = ({ data }) => {
    if (data.type === 'lead') {
      own = connect((m) => self.postMessage(m), undefined, data.rejoin === true);
      serveChannel(data.channel, data.leader);
    } else if (own) {
      receive(own, data);
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
  channel.onmessage = ({ data }) => {
    if (data?.to !== 'leader' || typeof data.from !== 'string') return;
    const from = data.from;
    if (data.msg?.type === 'hello') {
      // Welcomed first: the tab takes this leader's messages from then on, the count of tabs too.
      channel.postMessage({ to: from, leader, msg: { type: 'welcome' } });
      if (!followers.has(from)) {
        followers.set(from, connect((m) => channel.postMessage({ to: from, leader, msg: m }), data.msg.lock, data.msg.rejoin === true));
      }
      return;
    }
    const client = followers.get(from);
    if (client) receive(client, data.msg);
  };
  channel.postMessage({ to: '*', leader, msg: { type: 'leader' } });
}
