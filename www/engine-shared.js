// What the worker's engines (local-engine.js, remote-engine.js) and their host (engine-host.js)
// share: the request JSON the engine core takes, what a trap of the wasm instance looks like, and
// how an error crosses to the page.

/**
 * @import { WireError } from './protocol.d.ts'
 */

/**
 * A generation request's JSON for the engine core, which checks every option. JSON has no NaN or
 * Infinity (`JSON.stringify` writes null, which would mean "the default"), so a non-finite number
 * goes as its name, a string the engine refuses naming the option and its range; a `logit_bias`
 * of -Infinity goes as null, which bans the token as -Infinity does.
 * @param {Record<string, unknown>} body
 */
export function requestJson(body) {
  return JSON.stringify(body, function (key, value) {
    if (typeof value !== 'number' || Number.isFinite(value)) return value;
    return this === body.logit_bias && value === -Infinity ? null : String(value);
  });
}

/**
 * Whether `e` is a trap of the wasm instance: a `RuntimeError` (a panic or an allocation failure,
 * which abort: `unreachable`; a bad memory access), or a stack overflow (a RangeError in V8 and
 * JavaScriptCore, an InternalError in Firefox).
 * @param {unknown} e
 */
export function isTrap(e) {
  return e instanceof WebAssembly.RuntimeError
    || (e instanceof RangeError && /call stack/i.test(e.message))
    || (e instanceof Error && e.name === 'InternalError' && /recursion/i.test(e.message));
}

/**
 * An error as the page rebuilds it (a KestrelError): its code, message and what a remote server
 * answered.
 * @param {any} e whatever was thrown
 * @returns {WireError}
 */
export function errorOf(e) {
  return { code: (e && e.code) || 'internal', message: (e && e.message) || String(e), remote: e?.remote };
}
