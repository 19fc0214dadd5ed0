// Loaded first in every module worker the benchmark page starts (see wasm-heap.js): records each
// WebAssembly.Memory the worker creates or instantiates, and answers the page's query with their
// sizes. Linear memory only grows, so its size at the end of a run is the run's peak.
const CHANNEL = 'kestrel-bench-wasm-heap';
const memories = new Set();
const NativeMemory = WebAssembly.Memory;

WebAssembly.Memory = new Proxy(NativeMemory, {
  construct(target, args, newTarget) {
    const memory = Reflect.construct(target, args, newTarget);
    memories.add(memory);
    return memory;
  },
});

/**
 * Adds the memories an instance exports (the engine's own heap when it does not import one).
 * @param {WebAssembly.Instance} instance
 */
function recordExports(instance) {
  for (const value of Object.values(instance?.exports ?? {})) {
    if (value instanceof NativeMemory) memories.add(value);
  }
}

/**
 * `original` (WebAssembly.instantiate or instantiateStreaming), recording the exports of what it
 * instantiates.
 * @template {(...args: never[]) => Promise<WebAssembly.Instance | WebAssembly.WebAssemblyInstantiatedSource>} F
 * @param {F} original
 * @returns {F}
 */
function recording(original) {
  return /** @type {F} */ (async (/** @type {Parameters<F>} */ ...args) => {
    const result = await Reflect.apply(original, WebAssembly, args);
    // instantiate(module) resolves to the instance itself, instantiate(bytes) to {module, instance}.
    recordExports(result instanceof WebAssembly.Instance ? result : result.instance);
    return result;
  });
}
WebAssembly.instantiate = recording(WebAssembly.instantiate);
if (WebAssembly.instantiateStreaming) WebAssembly.instantiateStreaming = recording(WebAssembly.instantiateStreaming);
WebAssembly.Instance = new Proxy(WebAssembly.Instance, {
  construct(target, args, newTarget) {
    const instance = Reflect.construct(target, args, newTarget);
    recordExports(instance);
    return instance;
  },
});

const channel = new BroadcastChannel(CHANNEL);
channel.onmessage = ({ data }) => {
  if (data?.type !== 'query') return;
  channel.postMessage({ type: 'answer', query: data.query, bytes: [...memories].map((m) => m.buffer.byteLength) });
};
