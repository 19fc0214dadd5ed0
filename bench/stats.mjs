// Summaries of repeated measurements, as the native CLI computes them (crates/kestrel-cli
// src/commands/bench/stats.rs): median with range, nearest-rank percentiles.

/** {median, min, max, n} of `values`, or null when there are none. */
export function spread(values) {
  const v = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (!v.length) return null;
  const mid = v.length >> 1;
  const median = v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
  return { median, min: v[0], max: v.at(-1), n: v.length };
}

/** Nearest-rank {p50, p90, p99, n} of `values`, or null when there are none. */
export function percentiles(values) {
  const v = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (!v.length) return null;
  const at = (p) => v[Math.min(v.length, Math.max(1, Math.ceil((p / 100) * v.length))) - 1];
  return { p50: at(50), p90: at(90), p99: at(99), n: v.length };
}
