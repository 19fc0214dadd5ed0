// The engine an integration (ai-sdk.js, prompt-api.js, langchain.js) runs on: one the app gives
// it, or one it creates from createEngine's options on first use. Written once here so that every
// adapter checks the same settings, loads once however many calls wait, and retries a failed load.

/**
 * @import { CreateEngineOptions, Engine, LoadProgress } from './index.d.ts'
 */

import { kestrelError } from './errors.js';

/**
 * `settings` is `{ engine }` (an engine of createEngine, or a promise of one) or createEngine's
 * options (`{ model, ... }`); anything else, or both, is `invalid_option`.
 * @param {unknown} settings
 */
export function lazyEngine(settings) {
  if (settings == null || typeof settings !== 'object') {
    throw kestrelError('invalid_option', "invalid option settings: expected { engine } or createEngine's options ({ model, ... })");
  }
  const { engine: givenEngine, ...rest } = /** @type {{ engine?: Engine | Promise<Engine> } & Record<string, unknown>} */ (settings);
  const given = givenEngine ?? null;
  if (given !== null) {
    const isEngine = given instanceof Promise || typeof given?.chat?.completions?.create === 'function';
    if (!isEngine) throw kestrelError('invalid_option', 'invalid option engine: expected an engine from createEngine');
    const others = Object.keys(rest);
    if (others.length > 0) throw kestrelError('invalid_option', `invalid option engine: give either an engine or createEngine's options, not both (got engine and ${others.join(', ')})`);
  } else if (rest.model == null) {
    throw kestrelError('invalid_option', "invalid option model: expected the model's URL, File or Blob (or give an engine)");
  }
  const options = given === null ? /** @type {CreateEngineOptions} */ (/** @type {unknown} */ (rest)) : null;
  /** @type {Engine | null} */
  let loaded = null;
  /** @type {Promise<Engine> | null} */
  let loading = null;
  /** Whoever waits on the load follows its progress (createEngine's own `onProgress` too). */
  /** @type {Set<(progress: LoadProgress) => void>} */
  const listeners = new Set();

  return {
    /** The engine the app gave (it unloads it), else null. */
    given,
    /** createEngine's options, where the engine is created here; else null. */
    options,
    /** The engine once created here, else null. */
    get loaded() { return loaded; },
    /** Whether the engine is being created now. */
    get loading() { return loading !== null; },
    /**
     * The engine: the given one, or the one created once here (a failed load is tried again by
     * the next call). `onProgress` follows the load it waits on until `unlisten`.
     * @param {(progress: LoadProgress) => void} [onProgress]
     * @returns {Promise<Engine>}
     */
    load(onProgress) {
      if (given !== null) return Promise.resolve(given);
      if (loaded) return Promise.resolve(loaded);
      if (onProgress) listeners.add(onProgress);
      const opts = /** @type {CreateEngineOptions} */ (options);
      // Imported when first needed: langchain.js loads nothing of the engine's until it creates one.
      loading ??= import('./index.js').then(({ createEngine }) => createEngine({
        ...opts,
        onProgress: (p) => {
          opts.onProgress?.(p);
          for (const listener of listeners) listener(p);
        },
      })).then(
        (e) => { loaded = e; loading = null; return e; },
        (e) => { loading = null; throw e; },
      );
      return loading;
    },
    /** @param {(progress: LoadProgress) => void} onProgress */
    unlisten(onProgress) { listeners.delete(onProgress); },
    /**
     * Drops the engine created here (the next `load` creates it again) and resolves to it, for
     * its unload; null where none was.
     * @returns {Promise<Engine | null>}
     */
    async forget() {
      const current = loaded ?? (await loading?.catch(() => null)) ?? null;
      loaded = null;
      return current;
    },
  };
}
