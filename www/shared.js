// The page's side of the shared engine (createEngine({ shared: true })): a connection to the one
// engine of every tab that loads the same model with the same options (shared-worker.js), shaped
// like a Worker (postMessage, onmessage, onerror, terminate) so that the Engine of index.js drives
// it as it drives its own worker.
//
// Where the browser has SharedWorker, the engine is one, named after the model and its options.
// Elsewhere (Chrome on Android) the tabs elect a leader with a Web Lock: its dedicated worker hosts
// the engine, and the other tabs reach it over a BroadcastChannel. When the leader closes, the next
// tab in the lock's queue takes over and loads the model again (from the Cache API); the requests
// that ran on the old leader fail with `leader_lost`, which a retry answers.
//
// Each tab holds a Web Lock of its own while it lives: the engine is granted it when the tab
// closes or navigates away, and ends that tab's requests, whatever the tab had time to say.
//
// When the engine crashes (engine-host.js), its hub tells every tab ('crashed') and its worker
// closes itself; each tab's connection reaches a new one before its Engine (index.js) hears of it
// and loads the model again: the SharedWorker of the same name once the old one is gone, or the
// leading tab's new worker. The hub loads the model once for every tab that asks.

/**
 * @import { ChannelMessage, HubRequest, LeadMessage, LoadRequest, Reply, EngineRequest } from './protocol.d.ts'
 */

/**
 * Holds Web Lock `name` until the returned function is called.
 * @param {string} name
 * @returns {Promise<() => void>}
 */
async function holdLock(name) {
  /** @type {() => void} */
  let release = () => {};
  await new Promise((acquired) => {
    navigator.locks.request(name, () => {
      acquired(undefined);
      return new Promise((resolve) => (release = () => resolve(undefined)));
    });
  });
  return release;
}

/**
 * A connection to the shared engine of `key` (the model's URL and the engine's options).
 * `mode` says how it is reached: 'shared-worker', or 'leader' / 'follower' where the tabs elect one.
 */
export class SharedEngineConnection {
  /** @type {((e: { data: Reply }) => void) | null} */
  onmessage = null;
  /** @type {((e: ErrorEvent) => void) | null} */
  onerror = null;
  /** @type {'shared-worker' | 'leader' | 'follower'} */
  mode = 'shared-worker';
  /** @type {(msg: EngineRequest) => void} */
  #send = () => {};
  /** @type {() => void} */
  #close = () => {};
  #releaseClientLock = () => {};

  /**
   * Connects to the engine of `key`: its SharedWorker, or its leading tab.
   * @param {string} key
   * @returns {Promise<SharedEngineConnection>}
   */
  static async connect(key) {
    const connection = new SharedEngineConnection();
    const clientLock = `kestrel-client:${crypto.randomUUID()}`;
    connection.#releaseClientLock = await holdLock(clientLock);
    if (typeof SharedWorker === 'function') connection.#viaSharedWorker(key, clientLock);
    else connection.#viaLeader(key, clientLock);
    return connection;
  }

  /** @param {Reply} data */
  #deliver(data) {
    this.onmessage?.({ data });
  }

  /**
   * @param {string} key
   * @param {string} clientLock
   */
  #viaSharedWorker(key, clientLock) {
    // The name is not a constant, which Vite 5 refuses in worker options unless told to leave
    // them (it still bundles the worker): hence the @vite-ignore.
    const worker = new SharedWorker(new URL('./shared-worker.js', import.meta.url), { type: 'module', name: `kestrel:${key}` /* @vite-ignore */ });
    worker.onerror = (e) => this.onerror?.(/** @type {ErrorEvent} */ (e));
    const { port } = worker;
    port.onmessage = (/** @type {MessageEvent<Reply>} */ { data }) => {
      if (data?.type === 'status' && data.status === 'crashed' && data.engine) {
        worker.onerror = null;
        port.onmessage = null;
        port.close();
        this.#afterCrash(data.engine, key, clientLock);
      }
      this.#deliver(data);
    };
    /** @param {HubRequest} msg */
    const toHub = (msg) => port.postMessage(msg);
    toHub({ type: 'hello', lock: clientLock });
    this.#send = toHub;
    this.#close = () => {
      toHub({ type: 'bye' });
      port.close();
    };
  }

  /**
   * The SharedWorker's engine crashed and the worker closes itself: once it is gone (its Web Lock
   * free; a new SharedWorker of its name would otherwise join it), connects to a new one. What
   * this tab sends meanwhile waits.
   * @param {string} engine the crashed worker's id (shared-worker.js)
   * @param {string} key
   * @param {string} clientLock
   */
  #afterCrash(engine, key, clientLock) {
    /** @type {EngineRequest[]} */
    const waiting = [];
    let left = false;
    this.#send = (msg) => waiting.push(msg);
    this.#close = () => {
      left = true;
    };
    navigator.locks.request(`kestrel-engine-alive:${engine}`, () => {
      if (left) return;
      this.#viaSharedWorker(key, clientLock);
      for (const msg of waiting.splice(0)) this.#send(msg);
    });
  }

  /**
   * Without SharedWorker: leads (the first tab, or the next one once the leader is gone) or follows.
   * @param {string} key
   * @param {string} clientLock
   */
  #viaLeader(key, clientLock) {
    const me = crypto.randomUUID();
    const channel = new BroadcastChannel(`kestrel-channel:${key}`);
    /** @type {Worker | null} */
    let worker = null;
    /** The leader that welcomed this tab; messages wait until one has. */
    let leader = /** @type {string | null} */ (null);
    /** @type {EngineRequest[]} */
    const waiting = [];
    /** This tab's load, sent again by this tab when it takes over. */
    /** @type {LoadRequest | null} */
    let load = null;
    const stopWaiting = new AbortController();
    /** Ends this tab's lead, handing the engine to the next tab in line. */
    let stopLeading = () => {};
    const holdLead = () => new Promise((resolve) => (stopLeading = () => resolve(undefined)));
    const toLeader = (/** @type {HubRequest} */ msg) => channel.postMessage(/** @satisfies {ChannelMessage} */ ({ to: 'leader', from: me, msg }));
    /** Whether this tab lost its leader and waits for the model on the next one ('ready'). */
    let rejoining = false;
    const hello = () => toLeader({ type: 'hello', lock: clientLock, rejoin: rejoining });

    // Requests that ran on a leader that is gone fail (index.js rejects them with `leader_lost`).
    const lost = () => {
      rejoining = true;
      this.#deliver({ type: 'lost' });
    };

    /**
     * Starts the worker that hosts the engine and its hub for every tab (shared-worker.js).
     * @returns {Worker}
     */
    const startHub = () => {
      const hub = new Worker(new URL('./shared-worker.js', import.meta.url), { type: 'module' });
      hub.onmessage = (/** @type {MessageEvent<Reply>} */ { data }) => {
        // The engine crashed: a new worker takes its place, which the tabs' Engines load again.
        if (data?.type === 'status' && data.status === 'crashed') {
          hub.onmessage = null;
          hub.terminate();
          worker = startHub();
        }
        this.#deliver(data);
      };
      hub.onerror = (e) => this.onerror?.(e);
      hub.postMessage(/** @satisfies {LeadMessage} */ ({ type: 'lead', channel: `kestrel-channel:${key}`, leader: me, rejoin: rejoining }));
      return hub;
    };

    const lead = async () => {
      if (this.mode === 'follower' && leader) lost();
      this.mode = 'leader';
      leader = me;
      // Held while this tab leads: the tabs that follow it learn from it when it is gone.
      await holdLock(`kestrel-leader-alive:${me}`);
      worker = startHub();
      // Taking over: the model loads again (from the Cache API) for this tab and the others, and
      // the tabs that lost the old leader learn when it is ready.
      if (load) worker.postMessage({ ...load, id: 0 });
      for (const msg of waiting.splice(0)) worker.postMessage(msg);
    };

    /**
     * Watches leader `id`: its lock granted means its tab closed, and what ran there is lost (the
     * next leader's announcement may come later).
     * @param {string} id
     */
    const watch = (id) => {
      navigator.locks.request(`kestrel-leader-alive:${id}`, { signal: stopWaiting.signal }, () => {
        if (leader !== id) return;
        leader = null;
        lost();
      }).catch(() => {});
    };

    /** The leader this tab watches (`watch`), once per leader. */
    let watched = /** @type {string | null} */ (null);

    channel.onmessage = (/** @type {MessageEvent<ChannelMessage>} */ { data }) => {
      if (this.mode === 'leader') return;
      if (data?.to === '*' && data.msg?.type === 'leader') {
        // A new leader: what ran on the old one is lost; this tab says hello to the new one.
        if (leader && leader !== data.leader) {
          leader = null;
          lost();
        }
        hello();
        return;
      }
      if (data?.to !== me) return;
      if (data.msg?.type === 'welcome') {
        if (watched !== data.leader) {
          watched = data.leader;
          watch(data.leader);
        }
        leader = data.leader;
        rejoining = false;
        for (const msg of waiting.splice(0)) toLeader(msg);
        return;
      }
      if (data.leader !== leader) return;
      if (data.msg?.type === 'status' && data.msg.status === 'crashed') {
        // The leader's engine crashed; its tab starts a new one. What this tab sends waits for the
        // new one's welcome (the hello gets one if it runs already, its announcement otherwise).
        leader = null;
        hello();
      }
      // A leader announces itself to every tab ('*', above) and welcomes one (above): the rest is
      // what its hub answers this tab.
      this.#deliver(/** @type {Reply} */ (data.msg));
    };

    this.mode = 'follower';
    navigator.locks.request(`kestrel-leader:${key}`, { ifAvailable: true }, (lock) => {
      if (lock) {
        lead();
        return holdLead();
      }
      hello();
      // In line to lead once the tabs before it are gone.
      navigator.locks.request(`kestrel-leader:${key}`, { signal: stopWaiting.signal }, () => {
        lead();
        return holdLead();
      }).catch(() => {});
      return undefined;
    });

    this.#send = (msg) => {
      if (msg.type === 'load') load = msg;
      if (worker) worker.postMessage(msg);
      // A tab taking the lead has no worker until its alive lock is held: what it sends meanwhile
      // waits for lead() (to the channel it would reach no one: this tab is the leader).
      else if (leader && this.mode === 'follower') toLeader(msg);
      else waiting.push(msg);
    };
    this.#close = () => {
      stopWaiting.abort();
      if (worker) {
        // The leader leaving hands the engine over, as its tab closing would.
        worker.terminate();
        stopLeading();
      } else {
        toLeader({ type: 'bye' });
      }
      channel.close();
    };
  }

  /** @param {EngineRequest} msg */
  postMessage(msg) {
    this.#send(msg);
  }

  /** Leaves the shared engine: this tab's requests end; the engine lives on for the others. */
  terminate() {
    this.#close();
    this.#releaseClientLock();
  }
}
