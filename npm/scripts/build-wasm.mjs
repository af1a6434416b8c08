#!/usr/bin/env node
// Builds the two wasm artifacts from the one crate (DESIGN decision 2) into npm/wasm/:
//   crucible_core     the agent core (loop, tools, forge, registry) — loaded by the package
//   crucible_sandbox  the Boa sandbox entry point — loaded by the sandbox Worker
// Each artifact has its own cargo target dir so switching features never rebuilds the other.
// Then wasm-bindgen (pinned to the crate's version) and wasm-opt from npm `binaryen`
// (Debian's binaryen 108 emits wasm that fails to load).
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { gzipSync } from 'node:zlib';

const here = dirname(fileURLToPath(import.meta.url));
const npmDir = resolve(here, '..');
const root = resolve(npmDir, '..');
const outDir = join(npmDir, 'wasm');
const targetBase = process.env.CARGO_TARGET_DIR ? resolve(process.env.CARGO_TARGET_DIR) : join(root, 'target');
const skipOpt = process.env.CRUCIBLE_SKIP_WASM_OPT === '1';

const allArtifacts = [
  { name: 'crucible_core', features: 'wasm-core' },
  { name: 'crucible_sandbox', features: 'wasm-sandbox' },
];
// `--only crucible_sandbox` (or CRUCIBLE_WASM_ONLY=crucible_sandbox) builds one artifact.
const onlyArg = process.argv.indexOf('--only');
const only = onlyArg >= 0 ? process.argv[onlyArg + 1] : process.env.CRUCIBLE_WASM_ONLY;
const artifacts = only ? allArtifacts.filter((a) => a.name === only) : allArtifacts;
if (artifacts.length === 0) throw new Error(`unknown artifact '${only}'`);

function run(cmd, args, opts = {}) {
  console.error(`$ ${cmd} ${args.join(' ')}`);
  execFileSync(cmd, args, { stdio: 'inherit', cwd: root, ...opts });
}

function pinnedWasmBindgenVersion() {
  const lock = readFileSync(join(root, 'Cargo.lock'), 'utf8');
  const m = lock.match(/name = "wasm-bindgen"\nversion = "([^"]+)"/);
  if (!m) throw new Error('wasm-bindgen not found in Cargo.lock');
  return m[1];
}

function checkWasmBindgen() {
  const want = pinnedWasmBindgenVersion();
  let have = '';
  try {
    have = execFileSync('wasm-bindgen', ['--version'], { encoding: 'utf8' }).trim();
  } catch {
    throw new Error(`wasm-bindgen CLI not found; install it: cargo install wasm-bindgen-cli --version ${want}`);
  }
  if (!have.endsWith(want)) {
    throw new Error(`wasm-bindgen CLI is "${have}" but Cargo.lock pins ${want}; cargo install wasm-bindgen-cli --version ${want} --force`);
  }
}

function wasmOptPath() {
  const require = createRequire(import.meta.url);
  const pkg = dirname(require.resolve('binaryen/package.json'));
  return join(pkg, 'bin', 'wasm-opt');
}

checkWasmBindgen();
mkdirSync(outDir, { recursive: true });
for (const { name, features } of artifacts) {
  const targetDir = join(targetBase, features);
  run('cargo', [
    'build', '--release', '--lib', '--target', 'wasm32-unknown-unknown',
    '--no-default-features', '--features', features, '--target-dir', targetDir,
  ]);
  const raw = join(targetDir, 'wasm32-unknown-unknown', 'release', 'crucible.wasm');
  run('wasm-bindgen', ['--target', 'web', '--out-dir', outDir, '--out-name', name, raw]);
  const bg = join(outDir, `${name}_bg.wasm`);
  if (!skipOpt) {
    run(process.execPath, [wasmOptPath(), '-O3', '--enable-bulk-memory', '--enable-nontrapping-float-to-int',
      '--enable-sign-ext', '--enable-mutable-globals', '--enable-reference-types', '--enable-multivalue',
      bg, '-o', bg]);
  }
  const bytes = readFileSync(bg);
  console.error(`${name}: ${(statSync(bg).size / 1e6).toFixed(2)} MB raw, ${(gzipSync(bytes, { level: 9 }).length / 1e6).toFixed(2)} MB gzipped`);
}
for (const { name } of artifacts) {
  if (!existsSync(join(outDir, `${name}.js`))) throw new Error(`wasm-bindgen output missing for ${name}`);
}
