#!/usr/bin/env node
// Serves the built page (www/dist) on 127.0.0.1 and prints its URL. No dependencies.
// Usage: node scripts/serve.mjs [--port 4173] [--dir dist] [--query 'provider=…&model=…']
// (PORT=0 picks a free port; --query is added to the printed URL, for the page's settings)
import { createServer } from 'node:http';
import { readFile, stat } from 'node:fs/promises';
import { extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const arg = (name) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const root = resolve(fileURLToPath(new URL('..', import.meta.url)), arg('dir') ?? 'dist');
const port = Number(arg('port') ?? process.env.PORT ?? 4173);
const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.wasm': 'application/wasm',
  '.json': 'application/json',
  '.map': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
};

try {
  await stat(join(root, 'index.html'));
} catch {
  console.error(`No build at ${root}: run \`npm run build\` in www/ first.`);
  process.exit(1);
}

const server = createServer(async (req, res) => {
  try {
    const path = decodeURIComponent(new URL(req.url ?? '/', 'http://x').pathname);
    let file = normalize(join(root, path));
    if (file !== root && !file.startsWith(root + sep)) {
      res.writeHead(403).end();
      return;
    }
    if ((await stat(file).catch(() => null))?.isDirectory()) file = join(file, 'index.html');
    const body = await readFile(file);
    res.writeHead(200, {
      'content-type': TYPES[extname(file)] ?? 'application/octet-stream',
      'cache-control': 'no-cache',
      'x-content-type-options': 'nosniff',
    });
    res.end(req.method === 'HEAD' ? undefined : body);
  } catch {
    res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
  }
});

server.on('error', (err) => {
  if (err.code === 'EADDRINUSE') {
    console.error(`Port ${port} on 127.0.0.1 is in use (an earlier demo still serving?): stop that, or pass --port N (or PORT=N; 0 picks a free one).`);
  } else {
    console.error(`Cannot serve on 127.0.0.1:${port}: ${err.message}`);
  }
  process.exit(1);
});
server.listen(port, '127.0.0.1', () => {
  const { port: actual } = server.address();
  const query = arg('query');
  console.log(`Crucible demo: http://127.0.0.1:${actual}/${query ? `?${query}` : ''}`);
});
const stop = () => server.close(() => process.exit(0));
process.once('SIGINT', stop);
process.once('SIGTERM', stop);
