// Test double: the fetch target of the sandbox adversarial cases (Node and Chromium runs).
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { CaseContext } from './sandbox-cases.js';

/**
 * The local HTTP server the sandbox fetch cases target (`/ok`, `/redirect?to=`, `/big`), on
 * 127.0.0.1. It records every Host header it sees, so tests can prove no request reached another
 * host. CORS is open because in Chromium the page's origin is the static server's.
 */
export function startFetchServer(hostsSeen: string[]): Promise<{ server: Server; ctx: CaseContext }> {
  const server = createServer((req: IncomingMessage, res) => {
    res.setHeader('access-control-allow-origin', '*');
    res.setHeader('access-control-allow-headers', '*');
    if (req.method === 'OPTIONS') {
      res.statusCode = 204;
      res.end();
      return;
    }
    hostsSeen.push(req.headers.host ?? '');
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname === '/ok') {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ ok: true, path: '/ok' }));
    } else if (url.pathname === '/redirect') {
      res.statusCode = 302;
      res.setHeader('location', url.searchParams.get('to') ?? '/ok');
      res.end();
    } else if (url.pathname === '/big') {
      res.end('x'.repeat(2 * 1024 * 1024));
    } else {
      res.statusCode = 404;
      res.end();
    }
  });
  return listenOnLoopback(server).then((ctx) => ({ server, ctx }));
}

/** Starts `server` on a free port of 127.0.0.1: its origin and port. */
export function listenOnLoopback(server: Server): Promise<CaseContext> {
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => {
      const port = (server.address() as AddressInfo).port;
      resolve({ origin: `http://127.0.0.1:${port}`, port });
    }),
  );
}
