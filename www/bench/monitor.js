// The main thread while an engine generates: the longest task (Long Tasks API, tasks over 50 ms)
// and the frames dropped, counted from requestAnimationFrame gaps against the display's frame
// interval (measured before the generation starts).

/** Median gap between animation frames over `frames` frames, in ms. */
async function frameInterval(frames = 20) {
  /** @type {number[]} */
  const times = [];
  await new Promise((done) => {
    /** @type {FrameRequestCallback} */
    const tick = (t) => {
      times.push(t);
      if (times.length > frames) done(undefined);
      else requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  });
  const gaps = times.slice(1).map((t, i) => t - times[i]).sort((a, b) => a - b);
  return gaps[Math.floor(gaps.length / 2)];
}

/** Starts watching; `stop()` resolves to {longest_task_ms, long_tasks, frames, dropped_frames, frame_interval_ms}. */
export async function watchMainThread() {
  const interval = await frameInterval();
  let longest = 0;
  let longTasks = 0;
  const observer = typeof PerformanceObserver !== 'undefined' && PerformanceObserver.supportedEntryTypes?.includes('longtask')
    ? new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        longTasks += 1;
        longest = Math.max(longest, e.duration);
      }
    })
    : null;
  observer?.observe({ type: 'longtask' });
  let frames = 0;
  let dropped = 0;
  /** @type {number | null} */
  let last = null;
  let running = true;
  /** @type {FrameRequestCallback} */
  const tick = (t) => {
    if (last !== null) {
      frames += 1;
      // A gap of k intervals means k - 1 frames were missed (half an interval of tolerance).
      dropped += Math.max(0, Math.round((t - last) / interval) - 1);
    }
    last = t;
    if (running) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
  return {
    stop() {
      running = false;
      observer?.takeRecords().forEach((e) => { longTasks += 1; longest = Math.max(longest, e.duration); });
      observer?.disconnect();
      return {
        longest_task_ms: observer ? longest : null,
        long_tasks: observer ? longTasks : null,
        frames,
        dropped_frames: dropped,
        frame_interval_ms: interval,
      };
    },
  };
}

/**
 * Memory of this page and its workers by `performance.measureUserAgentSpecificMemory()` (needs
 * cross-origin isolation). Meant to include wasm linear memory, but headless Chromium 156
 * reports only JS heaps (a few MiB), so this is recorded in the JSON and not shown as the wasm
 * heap. Null where the browser does not answer within `timeoutMs`.
 */
export async function measureMemory(timeoutMs = 10_000) {
  if (!globalThis.crossOriginIsolated || !performance.measureUserAgentSpecificMemory) return null;
  // It may wait for a garbage collection; a benchmark does not wait for it forever.
  /** @type {Promise<null>} */
  const timeout = new Promise((resolve) => setTimeout(() => resolve(null), timeoutMs));
  const m = await Promise.race([performance.measureUserAgentSpecificMemory(), timeout]);
  if (!m) return null;
  const workers = m.breakdown
    .filter((b) => b.attribution.some((a) => a.scope === 'DedicatedWorkerGlobalScope'))
    .reduce((sum, b) => sum + b.bytes, 0);
  return { total_bytes: m.bytes, worker_bytes: workers };
}
