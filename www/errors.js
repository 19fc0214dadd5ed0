// The package's one error type: every promise it rejects, local or remote, rejects with a
// KestrelError, whose `code` is one of the stable codes index.d.ts lists (KestrelErrorCode).

/**
 * @import { KestrelErrorCode } from './index.d.ts'
 */

/** An error of the package: `code` is stable (switch on it), `message` precise. */
export class KestrelError extends Error {
  /**
   * @param {KestrelErrorCode} code
   * @param {string} message
   * @param {{ remote?: { status: number, code: string | null } }} [details] what a remote server answered
   */
  constructor(code, message, details) {
    super(message);
    this.name = 'KestrelError';
    /** @type {KestrelErrorCode} */
    this.code = code;
    if (details?.remote) this.remote = details.remote;
  }
}

/**
 * Whether `e` is an error of this package: also true for one made by another copy of it (two
 * bundles of the package on one page), where `instanceof` is false.
 * @param {unknown} e
 * @returns {e is KestrelError}
 */
export function isKestrelError(e) {
  return e instanceof KestrelError || (e instanceof Error && e.name === 'KestrelError' && typeof (/** @type {any} */ (e).code) === 'string');
}

/**
 * @param {KestrelErrorCode} code
 * @param {string} message
 * @returns {KestrelError}
 */
export function kestrelError(code, message) {
  return new KestrelError(code, message);
}
