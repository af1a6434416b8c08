/**
 * Sites serving test/browser/pages/sandbox-app.js with the built package: a Vite 7 bundle (how
 * the demo page and most apps load crucible-agents) and plain ES modules behind an import map.
 * Used by test/browser-sandbox.test.ts and test/browser-emergent.test.ts.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after } from 'node:test';
import { importMapSite, packageRoot, pagesRoot, startStaticServer, type StaticServer } from './harness.js';

const work = mkdtempSync(join(tmpdir(), 'crucible-bsandbox-'));
after(() => rmSync(work, { recursive: true, force: true }));

function runNode(file: string, args: string[], cwd: string): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [file, ...args], { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d));
    child.stderr.on('data', (d: Buffer) => (out += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, out }));
  });
}

/** Builds test/browser/pages/sandbox-app.js with Vite 7 against the built dist/. */
export async function viteSandboxSite(): Promise<{ site: StaticServer; assets: string[] }> {
  const dir = join(work, `vite-${Math.random().toString(36).slice(2)}`);
  mkdirSync(dir);
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'sandbox-vite-app', private: true, type: 'module' }));
  writeFileSync(join(dir, 'sandbox-app.js'), readFileSync(join(pagesRoot, 'sandbox-app.js')));
  writeFileSync(join(dir, 'main.js'), "import './sandbox-app.js';\nwindow.__readyOk();\n");
  writeFileSync(
    join(dir, 'index.html'),
    `<!doctype html><html><head><meta charset="utf-8"><title>sandbox (vite)</title><link rel="icon" href="data:,">
<script>window.__ready = new Promise((ok, fail) => { window.__readyOk = ok; window.__readyFail = fail; });</script>
</head><body><script type="module" src="/main.js"></script></body></html>`,
  );
  writeFileSync(
    join(dir, 'vite.config.mjs'),
    `export default { logLevel: 'warn', resolve: { alias: { 'crucible-agents': ${JSON.stringify(join(packageRoot, 'dist/browser.js'))} } } };\n`,
  );
  const vite = join(packageRoot, 'node_modules/vite/bin/vite.js');
  const { code, out } = await runNode(vite, ['build'], dir);
  assert.equal(code, 0, `vite build failed:\n${out}`);
  const assets = readdirSync(join(dir, 'dist/assets')).map((f) => `${f} ${(statSync(join(dir, 'dist/assets', f)).size / 1024).toFixed(1)} KiB`);
  return { site: await startStaticServer({ mounts: { '/': join(dir, 'dist') } }), assets };
}

/** Serves dist/ and wasm/ as they are, behind an import map. */
export function importMapSandboxSite(extraFiles: Record<string, string> = {}): Promise<StaticServer> {
  return importMapSite('sandbox-app.js', 'sandbox (import map)', extraFiles);
}

