// scripts/model/start.sh and use.sh (the local model's lifetime in test.sh and demo.sh), run
// against a stand-in llama-server: a small Python HTTP server that answers /health after
// FAKE_DELAY seconds, installed in a temporary CRUCIBLE_MODEL_DIR with setup.sh's stamp.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const modelScripts = join(repo, 'scripts/model');
let dir = '';

const FAKE_SERVER = `#!/usr/bin/env python3
import http.server, os, sys, time
if '--version' in sys.argv: print('stand-in'); sys.exit(0)
port = int(sys.argv[sys.argv.index('--port') + 1])
time.sleep(float(os.environ.get('FAKE_DELAY', '0')))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def log_message(self, *a): pass
http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()
`;

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'crucible-model-scripts-'));
  mkdirSync(join(dir, 'bin'));
  writeFileSync(join(dir, 'bin/llama-server'), FAKE_SERVER);
  chmodSync(join(dir, 'bin/llama-server'), 0o755);
  const setup = readFileSync(join(modelScripts, 'setup.sh'), 'utf8');
  const gguf = /^GGUF_SHA256="(\w+)"/m.exec(setup)![1];
  const size = Number(/^GGUF_SIZE=(\d+)/m.exec(setup)![1]);
  const gguffile = join(dir, 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf');
  writeFileSync(gguffile, '');
  truncateSync(gguffile, size); // sparse: setup.sh checks the size only on its fast path
  const reqs = createHash('sha256').update(readFileSync(join(modelScripts, 'requirements.txt'))).digest('hex');
  writeFileSync(join(dir, '.installed'), `reqs=${reqs} gguf=${gguf}\n`);
});
after(() => {
  // Stand-in servers a failed test left running.
  for (const f of readdirSync(dir).filter((n) => /^server-\d+\.pid$/.test(n))) {
    try { process.kill(Number(readFileSync(join(dir, f), 'utf8')), 'SIGKILL'); } catch { /* gone */ }
  }
  rmSync(dir, { recursive: true, force: true });
});

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

const env = (port: number, extra: Record<string, string> = {}) => ({
  ...process.env, CRUCIBLE_MODEL_DIR: dir, CRUCIBLE_MODEL_PORT: String(port), CRUCIBLE_MODEL_SERVER: 'prebuilt', ...extra,
});
const healthy = (port: number) => fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(1000) }).then((r) => r.ok, () => false);
const alive = (pid: number) => { try { process.kill(pid, 0); return true; } catch { return false; } };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
async function until(what: string, check: () => boolean | Promise<boolean>, ms = 15_000): Promise<void> {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(100)) if (await check()) return;
  assert.fail(`timed out waiting until ${what}`);
}

// One run as test.sh and demo.sh make it: prints the URL, then holds the server until `release` exists.
function run(port: number, release: string): { child: ChildProcess; url: Promise<string> } {
  const script = `. "${modelScripts}/use.sh"; trap model_release EXIT; trap 'exit 130' INT; model_use_lock; url="$(model_use)"; echo "$url"; while [ ! -e "${release}" ]; do sleep 0.1; done`;
  const child = spawn('bash', ['-euo', 'pipefail', '-c', script], { env: env(port), stdio: ['ignore', 'pipe', 'ignore'], detached: true });
  const url = new Promise<string>((res, rej) => {
    let out = '';
    child.stdout!.on('data', (d) => { out += d; if (out.includes('\n')) res(out.trim()); });
    child.once('exit', (code) => rej(new Error(`run exited with ${code} before printing a URL`)));
  });
  return { child, url };
}
const exited = (child: ChildProcess) => new Promise<number | null>((r) => (child.exitCode !== null ? r(child.exitCode) : child.once('exit', (c) => r(c))));
const pidOf = (port: number) => Number(readFileSync(join(dir, `server-${port}.pid`), 'utf8'));

test('start.sh stops a server it started that does not answer in time', async () => {
  const port = await freePort();
  const r = spawnSync('bash', [join(modelScripts, 'start.sh')], { env: env(port, { FAKE_DELAY: '30', CRUCIBLE_MODEL_START_TIMEOUT: '1' }), encoding: 'utf8' });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /did not answer/);
  const pid = Number(/pid (\d+)/.exec(r.stderr)![1]);
  await until('the unready server is gone', () => !alive(pid));
  assert.ok(!existsSync(join(dir, `server-${port}.pid`)));
});

test('overlapping runs share one server; the last one out stops it', async () => {
  const port = await freePort();
  const [relA, relB] = [join(dir, `release-a-${port}`), join(dir, `release-b-${port}`)];
  const a = run(port, relA);
  assert.equal(await a.url, `http://127.0.0.1:${port}/v1`);
  const pid = pidOf(port);
  const b = run(port, relB);
  assert.equal(await b.url, `http://127.0.0.1:${port}/v1`);
  assert.equal(pidOf(port), pid, 'the second run reuses the first run\'s server');
  writeFileSync(relA, '');
  assert.equal(await exited(a.child), 0);
  assert.ok(await healthy(port), 'the server outlives the first run while the second uses it');
  writeFileSync(relB, '');
  assert.equal(await exited(b.child), 0);
  await until('the server is stopped', () => !alive(pid));
});

test('Ctrl-C on a run stops the server it started', async () => {
  const port = await freePort();
  const a = run(port, join(dir, `never-${port}`));
  await a.url;
  const pid = pidOf(port);
  process.kill(-a.child.pid!, 'SIGINT'); // the whole process group, as a terminal's Ctrl-C
  assert.equal(await exited(a.child), 130);
  await until('the server is stopped', () => !alive(pid));
});

test('a server started by hand with start.sh is left running by a run that used it', async () => {
  const port = await freePort();
  const r = spawnSync('bash', [join(modelScripts, 'start.sh')], { env: env(port), encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const pid = pidOf(port);
  try {
    const rel = join(dir, `release-${port}`);
    const a = run(port, rel);
    await a.url;
    writeFileSync(rel, '');
    assert.equal(await exited(a.child), 0);
    assert.ok(await healthy(port));
  } finally {
    spawnSync('bash', [join(modelScripts, 'stop.sh')], { env: env(port) });
  }
  await until('stop.sh stopped it', () => !alive(pid));
});
