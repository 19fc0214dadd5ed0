// A small static server for the demo and the browser tests (not part of the npm package).
// Serves the repository's www/ and models/ folders on 127.0.0.1 with the headers the page needs:
// MIME types (application/wasm for streaming compilation), cross-origin isolation
// (COOP/COEP), and no HTTP caching (the package keeps models in the Cache API itself).
//   node www/serve.mjs [port]     (port 0 or absent: 8080; prints the URL)
import { createServer } from 'node:http';
import { createReadStream, promises as fs } from 'node:fs';
import { extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(fileURLToPath(new URL('..', import.meta.url)));
const ALLOWED = ['/www/', '/models/', '/tests/'];
/** @type {Record<string, string>} */
const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.ts': 'text/plain; charset=utf-8',
  '.png': 'image/png',
  '.svg': 'image/svg+xml',
  '.gguf': 'application/octet-stream',
};

/**
 * Starts the server; resolves to {url, port, log, close}. `log` lists every request's path.
 * `omitLength` sends files without a Content-Length (chunked), as hosts that compress on the fly do;
 * `ranges: false` ignores Range headers (answers 200 with the whole file), as some hosts do.
 * `pkg` serves /www/pkg/ from that folder instead: the browser suite's build of the wasm, with its
 * test hooks (tests/browser/crash.test.mjs).
 * `cutShort: {bytes, times}` ends the first `times` whole-file answers for a .gguf file after
 * `bytes` bytes, without a Content-Length, so they end as if complete: a host or proxy that cuts a
 * download short (tests/browser/download.test.mjs).
 * @param {{
 *   port?: number, host?: string, root?: string, quiet?: boolean, omitLength?: boolean, ranges?: boolean,
 *   pkg?: string | null, cutShort?: { bytes: number, times: number } | null,
 * }} [options]
 */
export function startServer({ port = 0, host = '127.0.0.1', root = ROOT, quiet = true, omitLength = false, ranges = true, pkg = null, cutShort = null } = {}) {
  /** @type {{ method: string | undefined, path: string, range: string | null }[]} */
  const log = [];
  let cut = 0;
  const server = createServer(async (req, res) => {
    // A server's request always has its URL (http.IncomingMessage types it as optional).
    const path = decodeURIComponent(new URL(/** @type {string} */ (req.url), 'http://x').pathname);
    log.push({ method: req.method, path, range: req.headers.range ?? null });
    if (!quiet) console.log(req.method, path);
    const headers = {
      'Cross-Origin-Opener-Policy': 'same-origin',
      'Cross-Origin-Embedder-Policy': 'require-corp',
      'Cross-Origin-Resource-Policy': 'same-origin',
      'Cache-Control': 'no-store',
    };
    if (path === '/') {
      res.writeHead(302, { ...headers, Location: '/www/demo/' });
      return res.end();
    }
    const [base, rest] = pkg && path.startsWith('/www/pkg/') ? [resolve(pkg), path.slice('/www/pkg'.length)] : [root, path];
    let file = normalize(join(base, rest));
    if (!ALLOWED.some((p) => path.startsWith(p)) || !(file + sep).startsWith(base + sep)) {
      res.writeHead(404, headers);
      return res.end('not found');
    }
    try {
      let stat = await fs.stat(file);
      if (stat.isDirectory()) {
        if (!path.endsWith('/')) {
          res.writeHead(301, { ...headers, Location: path + '/' });
          return res.end();
        }
        file = join(file, 'index.html');
        stat = await fs.stat(file);
      }
      const type = MIME[extname(file)] ?? 'application/octet-stream';
      // One byte range (`bytes=a-b` or `bytes=a-`), as `estimate()` asks for a file's header.
      const range = ranges && /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
      if (range) {
        const start = Number(range[1]);
        const end = Math.min(range[2] ? Number(range[2]) : stat.size - 1, stat.size - 1);
        if (start >= stat.size || start > end) {
          res.writeHead(416, { ...headers, 'Content-Range': `bytes */${stat.size}` });
          return res.end();
        }
        res.writeHead(206, { ...headers, 'Content-Type': type, 'Content-Range': `bytes ${start}-${end}/${stat.size}`, 'Content-Length': end - start + 1 });
        if (req.method === 'HEAD') return res.end();
        return createReadStream(file, { start, end }).pipe(res);
      }
      const short = cutShort && req.method === 'GET' && file.endsWith('.gguf') && cut < cutShort.times;
      if (short) cut++;
      res.writeHead(200, { ...headers, 'Content-Type': type, 'Accept-Ranges': ranges ? 'bytes' : 'none', ...(omitLength || short ? {} : { 'Content-Length': stat.size }) });
      if (req.method === 'HEAD') return res.end();
      createReadStream(file, short ? { end: cutShort.bytes - 1 } : {}).pipe(res);
    } catch {
      res.writeHead(404, headers);
      res.end('not found');
    }
  });
  return new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(port, host, () => {
      // Listening on a host and port, the address is an AddressInfo (a pipe's would be a string).
      const { port } = /** @type {import('node:net').AddressInfo} */ (server.address());
      ok({ url: `http://${host}:${port}`, port, log, close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); }) });
    });
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { url } = await startServer({ port: Number(process.argv[2] ?? 8080), quiet: false });
  console.log(`Kestrel demo: ${url}/www/demo/`);
}
