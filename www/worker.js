// The module worker of one page's engine (createEngine): it hosts the engine (engine-host.js) and
// answers its page alone.
import { handleMessage } from './engine-host.js';

self.onmessage = ({ data }) => handleMessage(data);
