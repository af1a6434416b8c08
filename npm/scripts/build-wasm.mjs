#!/usr/bin/env node
// Builds the two wasm artifacts from the one crate (DESIGN decision 2) into npm/wasm/:
//   crucible_core     the agent core (loop, tools, forge, registry) — loaded by the package
//   crucible_sandbox  the Boa sandbox entry point — loaded by the sandbox Worker
// Each artifact has its own cargo target dir so switching features never rebuilds the other.
// Then wasm-bindgen (pinned to the crate's version) and wasm-opt from npm `binaryen`
// (Debian's binaryen 108 emits wasm that fails to load).
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
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

// `sources`: the Rust files an artifact is built from (its cache key), `src` when it is all.
const allArtifacts = [
  // The core mostly moves JSON between JS and the loop: size beats raw speed there.
  // `wasmOpt`: one wasm-opt run per entry. A second run finds more than the first left (3.7 KB
  // less gzipped for the core, 2.5 KB for the sandbox, measured); a third gave some back.
  { name: 'crucible_core', features: 'wasm-core', optLevel: 's', wasmOpt: ['-Os', '-Os'], sources: ['src'] },
  // Boa at opt-level "s" then wasm-opt -O3: 1.31 MB gzipped instead of 1.74 MB at opt-level 3,
  // and forged-tool calls stay 0.1–0.4x fresh-context node:vm (measured, bench/sandbox), since
  // per-call cost is dominated by overhead the warm pool and the frozen realm already cut.
  // Its exports (src/wasm/sandbox.rs) reach only the sandbox module and js_json (reading JS's
  // JSON text), so a change to the agent core does not rebuild it (checked below: those files
  // may name no other crate module).
  { name: 'crucible_sandbox', features: 'wasm-sandbox', optLevel: 's', wasmOpt: ['-O3', '-O3'], sources: ['src/lib.rs', 'src/sandbox', 'src/js_json.rs', 'src/wasm/mod.rs', 'src/wasm/sandbox.rs'], onlyUses: ['sandbox', 'js_json'] },
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

// Content-addressed cache of finished artifacts: a fresh clone (CI) with unchanged Rust
// sources copies the previous build instead of spending minutes in LTO.
const cacheRoot = process.env.CRUCIBLE_WASM_CACHE ?? join(homedir(), '.cache', 'crucible', 'wasm');

function listFiles(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    return e.isDirectory() ? listFiles(p) : [p];
  });
}

function sourceFiles(artifact) {
  return artifact.sources.flatMap((s) => {
    const p = join(root, s);
    return statSync(p).isDirectory() ? listFiles(p) : [p];
  });
}

// A narrowed key is only sound while the artifact's files reach no other module of the crate.
function checkSourcesStandAlone(artifact) {
  if (!artifact.onlyUses) return;
  for (const file of sourceFiles(artifact)) {
    if (file.endsWith('lib.rs')) continue;
    for (const [, module] of readFileSync(file, 'utf8').matchAll(/crate::(\w+)/g)) {
      if (!artifact.onlyUses.includes(module)) {
        throw new Error(`${file.slice(root.length + 1)} uses crate::${module}: add it to the sources of ${artifact.name} in scripts/build-wasm.mjs`);
      }
    }
  }
}

// The compiler and wasm-opt shape the bytes as much as the sources do: a rustup update or a new
// binaryen must not restore wasm the old ones built.
function toolchainKey() {
  const rustc = execFileSync('rustc', ['-vV'], { encoding: 'utf8', cwd: root });
  const require = createRequire(import.meta.url);
  const binaryen = JSON.parse(readFileSync(require.resolve('binaryen/package.json'), 'utf8')).version;
  return { rustc, binaryen };
}

function sourceKey(artifact) {
  checkSourcesStandAlone(artifact);
  const h = createHash('sha256');
  const files = ['Cargo.toml', 'Cargo.lock', 'build.rs', '.cargo/config.toml', ...sourceFiles(artifact).map((p) => p.slice(root.length + 1))].sort();
  for (const f of files) {
    const p = join(root, f);
    if (!existsSync(p)) continue;
    h.update(f).update('\0').update(readFileSync(p)).update('\0');
  }
  h.update(JSON.stringify({ ...artifact, stripSections: true, remapPaths: true, lowMemoryUnused: true, optLevel: process.env.CRUCIBLE_OPT_LEVEL ?? artifact.optLevel, skipOpt, bindgen: pinnedWasmBindgenVersion(), ...toolchainKey() }));
  return h.digest('hex').slice(0, 24);
}

// Panic locations keep each source file's path in the wasm (nothing prints them: a panic traps,
// the core sets no hook and the sandbox's reads only the message). Dependencies' paths are
// remapped to paths relative to the registry (`regex-automata-0.4.18/src/...`; the crate's own
// are relative already): the same bytes whatever the machine's CARGO_HOME, and 648 B less
// gzipped for the core, ~740 B for the sandbox, measured. The checkout's path is not among the
// flags: rustflags that changed with it would rebuild every dependency in each new clone.
// Passed as `--config` so .cargo/config.toml's rustflags still apply.
function remapPathFlags() {
  const cargoHome = process.env.CARGO_HOME ? resolve(process.env.CARGO_HOME) : join(homedir(), '.cargo');
  const registry = join(cargoHome, 'registry', 'src');
  const indexes = existsSync(registry) ? readdirSync(registry).map((d) => join(registry, d)) : [];
  return [...indexes, join(cargoHome, 'git', 'checkouts')].map((from) => `--remap-path-prefix=${from}/=`);
}

const outputsOf = (name) => [`${name}.js`, `${name}.d.ts`, `${name}_bg.wasm`, `${name}_bg.wasm.d.ts`];

function restoreFromCache(name, key) {
  const dir = join(cacheRoot, `${name}-${key}`);
  if (!outputsOf(name).every((f) => existsSync(join(dir, f)))) return false;
  try {
    const now = new Date();
    utimesSync(dir, now, now); // marks it used, so another build's pruning keeps it
    for (const f of outputsOf(name)) copyFileSync(join(dir, f), join(outDir, f));
  } catch {
    return false; // pruned meanwhile by a build of another clone: build it instead
  }
  console.error(`${name}: unchanged sources, restored from ${dir}`);
  return true;
}

// Written beside the entry and renamed into place, so a build of another clone that shares the
// cache never restores an entry half copied (or one an interrupted build left short).
function saveToCache(name, key) {
  const dir = join(cacheRoot, `${name}-${key}`);
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  for (const f of outputsOf(name)) copyFileSync(join(outDir, f), join(tmp, f));
  rmSync(dir, { recursive: true, force: true });
  try {
    renameSync(tmp, dir);
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    if (!existsSync(dir)) throw err; // another build put the same entry there first
  }
  pruneCache(name);
}

// Every source change adds an entry (~4 MB); the cache keeps the ones used last, enough for a
// few branches or clones built in turn.
const CACHE_ENTRIES_KEPT = 6;
function pruneCache(name) {
  const entries = readdirSync(cacheRoot)
    .filter((e) => e.startsWith(`${name}-`) && !e.includes('.tmp-'))
    .map((e) => ({ dir: join(cacheRoot, e), used: statSync(join(cacheRoot, e)).mtimeMs }))
    .sort((a, b) => b.used - a.used);
  for (const { dir } of entries.slice(CACHE_ENTRIES_KEPT)) rmSync(dir, { recursive: true, force: true });
}

// wasm-bindgen's declarations name web platform types (`RequestInfo`, `BufferSource`,
// `WebAssembly.*`) in its init functions. The package's own declarations import event and
// result types from this file, so a Node-only program (no DOM library) that checks libraries
// (`skipLibCheck: false`) would fail on them. Spelled out here in types Node's declarations
// have, and the `WebAssembly` names declared empty (they merge with the DOM's where present).
// wasm-bindgen also gives exported classes a `[Symbol.dispose]()`, whose symbol only Node's
// declarations and TypeScript's esnext.disposable library declare: a browser program with an
// ES2022 library that checks libraries would fail on it, so it is declared here as they do.
// The cache keeps wasm-bindgen's own output and this runs on every build and restore, so a
// change here reaches cached artifacts too; a block a previous version appended is replaced.
const PORTABLE_MARK = '// crucible: portable declarations';
function portableDeclarations(name) {
  const file = join(outDir, `${name}.d.ts`);
  let text = readFileSync(file, 'utf8').split(`\n${PORTABLE_MARK}\n`)[0];
  text = text.replace(/\bRequestInfo\b/g, '(Request | string)').replace(/\bBufferSource\b/g, '(ArrayBufferView | ArrayBuffer)');
  const used = [...new Set([...text.matchAll(/WebAssembly\.([A-Z]\w*)/g)].map((m) => m[1]))].sort();
  const empty = used.map((t) => `    // eslint-disable-next-line @typescript-eslint/no-empty-interface\n    interface ${t} {}`).join('\n');
  const dispose = text.includes('[Symbol.dispose]') ? '  interface SymbolConstructor {\n    readonly dispose: unique symbol;\n  }\n' : '';
  text += `\n${PORTABLE_MARK}\ndeclare global {\n${dispose}  namespace WebAssembly {\n${empty}\n  }\n}\n`;
  writeFileSync(file, text);
}

checkWasmBindgen();
mkdirSync(outDir, { recursive: true });
for (const artifact of artifacts) {
  const { name, features, optLevel, wasmOpt } = artifact;
  const key = sourceKey(artifact);
  if (process.env.CRUCIBLE_WASM_NO_CACHE !== '1' && restoreFromCache(name, key)) {
    portableDeclarations(name);
    continue;
  }
  const targetDir = join(targetBase, features);
  // Cargo judges freshness by file times and keeps no checkout path in its fingerprints, so two
  // clones sharing this target dir (CI's clean clone beside a working tree) can each take the
  // other's build for fresh: a file edited before the other clone built would not be compiled,
  // and the other sources' wasm would be cached under this key. So a build of other sources
  // than the last one here recompiles the crate itself (its dependencies stay built).
  const lastBuilt = join(targetDir, `${name}.source-key`);
  if (existsSync(targetDir) && (!existsSync(lastBuilt) || readFileSync(lastBuilt, 'utf8') !== key)) {
    run('cargo', ['clean', '-p', 'crucible', '--release', '--target', 'wasm32-unknown-unknown', '--target-dir', targetDir]);
  }
  run('cargo', [
    'build', '--release', '--lib', '--target', 'wasm32-unknown-unknown',
    '--no-default-features', '--features', features, '--target-dir', targetDir,
    '--config', `target.wasm32-unknown-unknown.rustflags=${JSON.stringify(remapPathFlags())}`,
  ], { env: { ...process.env, CARGO_PROFILE_RELEASE_OPT_LEVEL: process.env.CRUCIBLE_OPT_LEVEL ?? optLevel } });
  const raw = join(targetDir, 'wasm32-unknown-unknown', 'release', 'crucible.wasm');
  run('wasm-bindgen', ['--target', 'web', '--out-dir', outDir, '--out-name', name, raw]);
  const bg = join(outDir, `${name}_bg.wasm`);
  if (!skipOpt) {
    // `--low-memory-unused`: wasm-opt may fold a constant added to a pointer into the access's
    // offset (`load(p + 16)` as `load offset=16 (p)`), which differs only where `p + 16` wraps
    // past 4 GiB into the first KiB: no Rust pointer does, and the stack comes first (rust-lld's
    // layout) so data and heap start at 1 MiB (the core) or 8 MiB (the sandbox). The bottom of
    // the stack is an access at or above 0 either way, and overflowing it still traps.
    // 3,352 B less gzipped for the core, 4,119 B for the sandbox, measured; fewer instructions.
    const lowMemoryUnused = ['--low-memory-unused'];
    // The last run drops the producers and target-features sections (tool metadata nothing
    // loads; wasm-opt reads the features before stripping them): 267 B less gzipped for the
    // core, 244 B for the sandbox, measured.
    wasmOpt.forEach((level, i) => {
      const strip = i === wasmOpt.length - 1 ? ['--strip-producers', '--strip-target-features'] : [];
      run(process.execPath, [wasmOptPath(), level, ...lowMemoryUnused, '--enable-bulk-memory', '--enable-nontrapping-float-to-int',
        '--enable-sign-ext', '--enable-mutable-globals', '--enable-reference-types', '--enable-multivalue',
        ...strip, bg, '-o', bg]);
    });
  }
  writeFileSync(lastBuilt, key);
  saveToCache(name, key);
  portableDeclarations(name);
  const bytes = readFileSync(bg);
  console.error(`${name}: ${(statSync(bg).size / 1e6).toFixed(2)} MB raw, ${(gzipSync(bytes, { level: 9 }).length / 1e6).toFixed(2)} MB gzipped`);
}
for (const { name } of artifacts) {
  if (!existsSync(join(outDir, `${name}.js`))) throw new Error(`wasm-bindgen output missing for ${name}`);
}
