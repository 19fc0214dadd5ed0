// The origin's storage, shared by the page side (index.js) and the worker: where model files and
// the saved KV prefixes live, and whether the storage quota has room for more.

/** The Cache API cache that keeps downloaded model files. */
export const CACHE_NAME = 'kestrel-models';

/**
 * On a split model's shard in the Cache API: `k/n URL`, shard k of n of the model whose first
 * shard is at URL (the worker writes it; the page's cache helpers group by it).
 */
export const SHARD_HEADER = 'x-kestrel-shard';

/** The Origin Private File System directory of the KV prefixes `persistPrefix` saves. */
export const PREFIX_DIRECTORY = 'kestrel-kv-prefixes';

/**
 * Bytes the origin's storage quota still has room for (Infinity where the browser cannot tell).
 * @returns {Promise<number>}
 */
export async function storageRoom() {
  const { usage, quota } = (await globalThis.navigator?.storage?.estimate?.().catch(() => null)) ?? {};
  return usage != null && quota != null ? Math.max(0, quota - usage) : Infinity;
}
