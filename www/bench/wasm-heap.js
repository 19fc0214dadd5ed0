// The wasm heap of each engine, measured the same way for all of them: every module worker this
// page starts loads wasm-heap-hook.js before its own code, and `wasmHeapBytes()` asks them for
// the sizes of the linear memories they made. (measureUserAgentSpecificMemory() would be the
// standard way, but headless Chromium 156 leaves wasm memory out of it.)
const CHANNEL = 'kestrel-bench-wasm-heap';
const HOOK = new URL('./wasm-heap-hook.js', import.meta.url).href;

/**
 * What crosses the channel: the page's query, and each hooked worker's answer to it (the byte
 * sizes of its linear memories).
 * @typedef {{ type: 'query', query: number } | { type: 'answer', query: number, bytes: number[] }} HeapMessage
 */

/** Makes every module worker started after this call load the hook first. */
export function hookWorkers() {
  const NativeWorker = globalThis.Worker;
  globalThis.Worker = class HookedWorker extends NativeWorker {
    /**
     * @param {string | URL} url
     * @param {WorkerOptions} [options]
     */
    constructor(url, options) {
      if (options?.type !== 'module') {
        super(url, options);
        return;
      }
      // The engine's own script keeps its URL (import.meta.url, relative imports); only the
      // worker's location becomes this wrapper's blob URL.
      const target = new URL(url, location.href).href;
      const source = `import ${JSON.stringify(HOOK)};\nimport ${JSON.stringify(target)};\n`;
      super(URL.createObjectURL(new Blob([source], { type: 'text/javascript' })), options);
    }
  };
}

/**
 * The total size of the linear memories of this page's hooked workers, in bytes: the peak, as
 * linear memory never shrinks. Every idle worker answers at once; `waitMs` bounds the wait.
 * Null when no worker answered.
 */
export async function wasmHeapBytes(waitMs = 2000) {
  const channel = new BroadcastChannel(CHANNEL);
  const query = Math.random();
  /** @type {number | null} */
  let total = null;
  channel.onmessage = (/** @type {MessageEvent<HeapMessage | null>} */ { data }) => {
    if (data?.type !== 'answer' || data.query !== query) return;
    total = (total ?? 0) + data.bytes.reduce((sum, b) => sum + b, 0);
  };
  channel.postMessage(/** @satisfies {HeapMessage} */ ({ type: 'query', query }));
  await new Promise((resolve) => setTimeout(resolve, waitMs));
  channel.close();
  return total;
}
