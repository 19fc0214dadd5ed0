// A local stand-in for a model hub such as Hugging Face, for model-url.test.mjs: two HTTP servers
// on loopback ports other than the test page's, so that both are other origins than the page's.
// The hub answers `/<org>/<repo>/resolve/main/<file>` with a 302 redirect to the CDN, as the real
// hub redirects its download links; the CDN serves the file's bytes with the headers the real one
// sends: CORS for any origin (Access-Control-Allow-Origin: *) with the length and range headers
// exposed, and byte ranges (206 Partial Content). Both answer CORS preflights. `cors: false`
// drops every CORS header, as a host that does not allow other origins does.
import { createReadStream, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { basename } from 'node:path';

const HOST = '127.0.0.1';

/** Listens on a free loopback port; resolves to the server's base URL. */
function listen(server) {
  return new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(0, HOST, () => ok(`http://${HOST}:${server.address().port}`));
  });
}

/**
 * Starts the hub and its CDN serving `file` (a path on disk). Resolves to
 * `{ url, origins, log, close }`: `url` is the file's download link on the hub, `origins` the
 * hub's and the CDN's, `log` lists every request either server got as
 * `{ server: 'hub' | 'cdn', method, path, range, origin }` (`origin`: the request's Origin
 * header, which browsers send on CORS requests).
 */
export async function startModelHub({ file, org = 'kestrel-test', repo = 'synthetic-GGUF', cors = true }) {
  const name = basename(file);
  const size = statSync(file).size;
  const log = [];
  const corsHeaders = (req) => (cors ? {
    'Access-Control-Allow-Origin': '*',
    'Access-Control-Expose-Headers': 'Content-Length, Content-Range, Accept-Ranges, ETag',
    ...(req.method === 'OPTIONS' ? {
      'Access-Control-Allow-Methods': 'GET, HEAD, OPTIONS',
      'Access-Control-Allow-Headers': req.headers['access-control-request-headers'] ?? 'Range',
    } : {}),
  } : {});
  const record = (server, req) => log.push({
    server, method: req.method, path: req.url, range: req.headers.range ?? null, origin: req.headers.origin ?? null,
  });

  // The CDN's path looks like a content-addressed object with a signed query, as the real one's
  // does: nothing in the client may depend on the file's name surviving the redirect.
  const cdnPath = `/blobs/${size.toString(16)}`;
  const cdn = createServer((req, res) => {
    record('cdn', req);
    const headers = corsHeaders(req);
    if (req.method === 'OPTIONS') return res.writeHead(204, headers).end();
    if (new URL(req.url, 'http://x').pathname !== cdnPath) return res.writeHead(404, headers).end('not found');
    // no-store keeps Chromium's HTTP cache from answering part of a request from the range reads
    // before it (which would change what reaches this server, not what the page receives): the
    // test counts requests, and the Cache API copy it checks is the package's own.
    const common = { ...headers, 'Content-Type': 'application/octet-stream', 'Accept-Ranges': 'bytes', ETag: `"${size}"`, 'Cache-Control': 'no-store' };
    // One byte range (`bytes=a-b` or `bytes=a-`), as `estimate()` asks for the header.
    const range = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
    if (range) {
      const start = Number(range[1]);
      const end = Math.min(range[2] ? Number(range[2]) : size - 1, size - 1);
      if (start >= size || start > end) return res.writeHead(416, { ...common, 'Content-Range': `bytes */${size}` }).end();
      res.writeHead(206, { ...common, 'Content-Range': `bytes ${start}-${end}/${size}`, 'Content-Length': end - start + 1 });
      if (req.method === 'HEAD') return res.end();
      return createReadStream(file, { start, end }).pipe(res);
    }
    res.writeHead(200, { ...common, 'Content-Length': size });
    if (req.method === 'HEAD') return res.end();
    createReadStream(file).pipe(res);
  });
  const cdnUrl = await listen(cdn);

  const resolvePath = `/${org}/${repo}/resolve/main/${name}`;
  const hub = createServer((req, res) => {
    record('hub', req);
    const headers = corsHeaders(req);
    if (req.method === 'OPTIONS') return res.writeHead(204, headers).end();
    if (new URL(req.url, 'http://x').pathname !== resolvePath) return res.writeHead(404, headers).end('Entry not found');
    res.writeHead(302, { ...headers, Location: `${cdnUrl}${cdnPath}?X-Amz-Signature=test&response-content-disposition=attachment` }).end();
  });
  const hubUrl = await listen(hub);

  const close = (server) => new Promise((done) => {
    server.closeAllConnections();
    server.close(done);
  });
  return { url: `${hubUrl}${resolvePath}`, origins: [hubUrl, cdnUrl], log, close: () => Promise.all([close(hub), close(cdn)]) };
}
