// The KV prefixes kept across page loads (createEngine's `persistPrefix`): snapshots of the KV
// cache rows of a conversation, one file each in the Origin Private File System, in one directory
// for every model. A snapshot starts with its key (the model file's sha256 and the cache's value
// type, so that setups never mix) and its token ids (read with
// `peekPrefixSnapshot` to choose one) and ends with a checksum the engine verifies before it
// restores any row: a corrupt or truncated file is deleted, never trusted; another model's (or
// another cache setup's) is left for that model, and the byte budget bounds them all.
import { peekPrefixSnapshot } from './wasm.js';
import { PREFIX_DIRECTORY } from './storage.js';
/** Restoring reads a whole snapshot: worth it only when it saves this many prefill tokens. */
export const MIN_RESTORED_TOKENS = 16;

/**
 * @typedef {{ name: string, key: string, tokens: Uint32Array | number[], bytes: number, written: number }} Entry
 */

/**
 * How many leading tokens `a` and `b` share.
 * @param {ArrayLike<number>} a
 * @param {ArrayLike<number>} b
 */
export function sharedPrefix(a, b) {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/**
 * The header of a snapshot (`peekPrefixSnapshot`'s answer: its key and tokens) from `read(n)`,
 * its first n bytes, reading no more than the header needs (4 KiB first, then what it asks for).
 * @param {(n: number) => Promise<Uint8Array>} read
 * @param {number} size the snapshot's whole length
 */
async function peekHeader(read, size) {
  let need = 4096;
  for (;;) {
    const peek = peekPrefixSnapshot(await read(Math.min(need, size)));
    if (peek.tokens) return peek;
    // A file shorter than its own header says: a save cut short.
    if (peek.need > size) throw Object.assign(new Error('truncated'), { code: 'bad_snapshot' });
    need = peek.need;
  }
}

export class PrefixStore {
  /**
   * @param {string} modelKey the model file's sha256 (hex)
   * @param {number} maxBytes the most all snapshots (of every model) may take together
   */
  constructor(modelKey, maxBytes) {
    this.modelKey = modelKey;
    this.maxBytes = maxBytes;
    /**
     * Snapshots of this key the engine refused as another setup's (a RoPE table of another
     * context): not read again in this session.
     * @type {Set<string>}
     */
    this.refused = new Set();
  }

  /**
   * The store for one model, or null where this browser has no Origin Private File System.
   * @param {string} modelKey
   * @param {number} maxBytes
   */
  static async open(modelKey, maxBytes) {
    if (!globalThis.navigator?.storage?.getDirectory) return null;
    const store = new PrefixStore(modelKey, maxBytes);
    await store.directory();
    return store;
  }

  /**
   * The store's directory, looked up (made where missing) for each operation: a handle kept
   * across requests would go stale when `clearSavedPrefixes()` deletes the directory under a
   * live engine, and every later save would fail.
   * @returns {Promise<FileSystemDirectoryHandle>}
   */
  async directory() {
    const root = await navigator.storage.getDirectory();
    return root.getDirectoryHandle(PREFIX_DIRECTORY, { create: true });
  }

  /**
   * Every snapshot in the store (of every model). Files that are not snapshots are deleted on the
   * way; one that cannot be opened now (another tab removing it) is skipped.
   */
  async entries() {
    /** @type {Entry[]} */
    const entries = [];
    for await (const [name, handle] of (await this.directory()).entries()) {
      if (handle.kind !== 'file') continue;
      let file;
      try {
        file = await handle.getFile();
      } catch {
        continue;
      }
      try {
        const { key, tokens } = await peekHeader(async (n) => new Uint8Array(await file.slice(0, n).arrayBuffer()), file.size);
        entries.push({ name, key, tokens, bytes: file.size, written: file.lastModified });
      } catch (e) {
        if (/** @type {{ code?: string }} */ (e)?.code === 'bad_snapshot') await this.remove(name);
      }
    }
    return entries;
  }

  /**
   * The snapshot of this model sharing the most leading tokens with `prompt`, and how many.
   * @param {ArrayLike<number>} prompt
   */
  async best(prompt) {
    /** @type {Entry | null} */
    let best = null;
    let shared = 0;
    for (const e of await this.entries()) {
      const n = e.key === this.modelKey && !this.refused.has(e.name) ? sharedPrefix(e.tokens, prompt) : 0;
      if (n > shared) [best, shared] = [e, n];
    }
    return { entry: best, shared };
  }

  /** @param {Entry} entry */
  async read(entry) {
    const handle = await (await this.directory()).getFileHandle(entry.name);
    return new Uint8Array(await (await handle.getFile()).arrayBuffer());
  }

  /** @param {string} name */
  async remove(name) {
    await (await this.directory()).removeEntry(name).catch(() => {});
  }

  /**
   * Stores the snapshot `bytes` (at most the byte budget: the engine cut it to fit), drops this
   * model's snapshots it extends (their tokens are a prefix of its own), then the least recently
   * written ones beyond the budget.
   * @param {Uint8Array<ArrayBuffer>} bytes
   */
  async save(bytes) {
    // The tokens the snapshot itself holds (the save may have kept fewer than the cache), read
    // from its header alone: the whole snapshot is not copied into wasm memory again.
    const { tokens } = await peekHeader(async (n) => bytes.subarray(0, n), bytes.byteLength);
    // Named by the snapshot's own SHA-256 (the last 12 of the 32 bytes that end it): the same
    // tokens saved from another cache setup get another file.
    const digest = bytes.subarray(bytes.byteLength - 12);
    const name = `${this.modelKey.slice(0, 16)}-${[...digest].map((b) => b.toString(16).padStart(2, '0')).join('')}.kv`;
    // Written to a swap file and swapped in on close: a reader never sees half a snapshot. A
    // failed write (the quota, where the estimate did not tell) leaves no empty file behind.
    const handle = await (await this.directory()).getFileHandle(name, { create: true });
    try {
      const writable = await handle.createWritable();
      try {
        await writable.write(bytes);
        await writable.close();
      } catch (e) {
        await writable.abort().catch(() => {});
        throw e;
      }
    } catch (e) {
      await this.remove(name);
      throw e;
    }
    const entries = await this.entries();
    const kept = [];
    for (const e of entries) {
      const extended = e.name !== name && e.key === this.modelKey && sharedPrefix(e.tokens, tokens) === e.tokens.length;
      if (extended) await this.remove(e.name);
      else kept.push(e);
    }
    kept.sort((a, b) => a.written - b.written);
    let total = kept.reduce((sum, e) => sum + e.bytes, 0);
    for (const e of kept) {
      if (total <= this.maxBytes) break;
      if (e.name === name) continue;
      await this.remove(e.name);
      total -= e.bytes;
    }
  }
}
