// The module worker of one page's engine (createEngine): it hosts the engine (engine-host.js) and
// answers its page alone.

/**
 * @import { HostReply, EngineRequest } from './protocol.d.ts'
 */

import { EngineHost } from './engine-host.js';

const host = new EngineHost((/** @type {HostReply} */ msg) => self.postMessage(msg));
self.onmessage = (/** @type {MessageEvent<EngineRequest>} */ { data }) => host.handleMessage(data);
