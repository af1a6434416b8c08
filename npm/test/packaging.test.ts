// Packaging tests (in the style of Automerge's): `npm pack` the package as built, install the
// tarball into tiny throwaway projects and prove it loads and runs an agent there —
// (a) a Node ESM project (and its types under `tsc`), (b) a Vite 7 project in Chromium,
// (c) a plain ES module page with an import map in Chromium. The model is the mock LLM
// server (a test double speaking the OpenAI wire format) on 127.0.0.1. Each also forges tools
// (issue 4) with the sandbox Workers and sandbox wasm as packed; their judge is a test-double
// ModelProvider that approves.
//
// Assumes the package is built (`npm run build`, or `npm run build:ts` once the wasm exists).
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import type { Browser } from 'playwright-core';
import { startMockLlmServer, type MockLlmServer, type MockResponder } from './support/mock-llm-server.js';
import { describeInBrowser, launchChromium, openPage, packageRoot, pagesRoot, startStaticServer, type StaticServer } from './browser/harness.js';
import { SLUGIFY_FORGE } from './support/forge-fixtures.js';

const run = promisify(execFile);
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
const work = mkdtempSync(join(tmpdir(), 'crucible-packaging-'));
after(() => rmSync(work, { recursive: true, force: true }));

/** What the test double answers: call the weather tool, then answer from its result. */
const weatherResponder: MockResponder = (request) => {
  const last = request.messages.at(-1);
  if (last?.role === 'tool') return { text: `It is ${JSON.parse(last.content).celsius} degrees in Oslo.` };
  return { toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] };
};
const expectedAnswer = 'It is 21 degrees in Oslo.';
/** What the judge test double answers for every forge in the Node scenario: approve. */
const APPROVING_VERDICT = { approved: true, safety: 0.95, correctness: 0.95, determinism: 0.95, boundedness: 0.9, confidence: 0.9, reasoning: 'ok' };

interface Packed {
  tarball: string;
  size: number;
  unpackedSize: number;
  files: Array<{ path: string; size: number }>;
}

let packing: Promise<Packed> | undefined;
/** `npm pack` once per run (the suites below share it). */
function packed(): Promise<Packed> {
  packing ??= (async () => {
    const missing = ['dist/index.js', 'dist/index.d.ts', 'dist/node.js', 'dist/browser.js', 'wasm/crucible_core.js', 'wasm/crucible_core_bg.wasm'].filter(
      (f) => !existsSync(join(packageRoot, f)),
    );
    assert.deepEqual(missing, [], `the package is not built (missing ${missing.join(', ')}): run \`npm run build\` in npm/ (or \`npm run build:ts\` when the wasm is built)`);
    const { stdout } = await run(npm, ['pack', '--json', '--pack-destination', work], { cwd: packageRoot, maxBuffer: 16 << 20 });
    const [info] = JSON.parse(stdout) as Array<{ filename: string; size: number; unpackedSize: number; files: Array<{ path: string; size: number }> }>;
    return { tarball: join(work, info!.filename), size: info!.size, unpackedSize: info!.unpackedSize, files: info!.files };
  })();
  return packing;
}

let installing: Promise<string> | undefined;
/**
 * A project with only the tarball installed, install scripts off: the package needs none.
 * `--prefer-offline`: the dependencies' tarballs come from npm's cache, which `npm ci` in npm/
 * filled, but not their metadata (`npm ci` reads versions from the lockfile and never fetches
 * it), so on a fresh machine that is read from the registry once; later runs stay offline.
 */
function installedProject(): Promise<string> {
  installing ??= (async () => {
    const { tarball } = await packed();
    const dir = join(work, 'app');
    mkdirSync(dir);
    writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'packaging-app', private: true, type: 'module' }, null, 2));
    await run(npm, ['install', tarball, '--prefer-offline', '--ignore-scripts', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: dir }).catch(
      (error: { stderr?: string }) => {
        throw new Error(`installing the tarball failed (its dependencies come from npm's cache, or the registry):\n${error.stderr}`);
      },
    );
    return dir;
  })();
  return installing;
}

/** A file of the installed package, as the tarball had it. */
async function installedFile(path: string): Promise<string> {
  return readFileSync(join(await installedProject(), 'node_modules/crucible-agents', path), 'utf8');
}

const kb = (n: number): string => `${(n / 1024).toFixed(1)} KiB`;

/** Runs `node file` (asynchronously: the mock server in this process must keep answering). */
function runNode(file: string, args: string[], cwd: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [file, ...args], { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d));
    child.stderr.on('data', (d: Buffer) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** The lowest version a `>=x.y.z` style engines range admits, or undefined for other forms. */
function lowestAdmitted(range: string): number[] | undefined {
  const m = /^>=\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?$/.exec(range.trim());
  return m ? [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)] : undefined;
}
const atLeast = (a: number[], b: number[]): boolean => {
  for (let i = 0; i < 3; i++) if (a[i]! !== b[i]!) return a[i]! > b[i]!;
  return true;
};

describe('the packed tarball', () => {
  test('holds the built JS, its types and the wasm, and no sources or tests', async () => {
    const { tarball, size, unpackedSize, files } = await packed();
    const paths = files.map((f) => f.path);
    for (const required of ['package.json', 'README.md', 'LICENSE-MIT', 'LICENSE-APACHE', 'dist/index.js', 'dist/index.d.ts', 'dist/node.js', 'dist/browser.js', 'wasm/crucible_core.js', 'wasm/crucible_core_bg.wasm']) {
      assert.ok(paths.includes(required), `${required} is in the tarball`);
    }
    assert.ok(paths.filter((p) => /^dist\/.+\.js$/.test(p)).length > 5);
    assert.ok(paths.filter((p) => /^dist\/.+\.d\.ts$/.test(p)).length > 5);
    // Every module has its declarations, and the entry points named in package.json exist.
    for (const js of paths.filter((p) => /^dist\/.+\.js$/.test(p))) assert.ok(paths.includes(js.replace(/\.js$/, '.d.ts')), `${js} has a .d.ts`);
    const manifest = JSON.parse(readFileSync(join(packageRoot, 'package.json'), 'utf8')) as { main: string; types: string; exports: Record<string, unknown> };
    const targets = (node: unknown): string[] => (typeof node === 'string' ? [node] : Object.values(node as object).flatMap(targets));
    for (const target of [manifest.main, manifest.types, ...targets(manifest.exports)]) {
      const path = target.replace(/^\.\//, '');
      // A subpath pattern (`./wasm/*`) names the packed files it matches.
      const [before, after] = path.split('*');
      const named = after === undefined ? paths.includes(path) : paths.some((p) => p.startsWith(before!) && p.endsWith(after) && p.length > path.length - 1);
      assert.ok(named, `${target}, named in package.json, is packed`);
    }
    const strays = paths.filter((p) => /^(src|test|scripts|node_modules)\//.test(p) || /\.(ts|tsx)$/.test(p.replace(/\.d\.ts$/, '')) || p.endsWith('.tgz'));
    assert.deepEqual(strays, [], 'no sources, tests, scripts or tarballs are packed');
    // Its README is for someone who installed it: how to install and use it, not the
    // repository's scripts (not packed), layout or benchmarks.
    const readme = (await installedFile('README.md')).split('\n## ').map((s) => s.split('\n')[0]);
    assert.deepEqual(readme.slice(1), ['Install', 'Using the package']);
    assert.doesNotMatch(await installedFile('README.md'), /scripts\/demo\.sh|scripts\/setup\.sh/);

    const wasm = paths.filter((p) => p.endsWith('.wasm'));
    assert.ok(wasm.length >= 1);
    console.log(`# tarball ${tarball.split('/').at(-1)}: ${kb(size)} packed, ${kb(unpackedSize)} unpacked, ${files.length} files`);
    for (const p of wasm) {
      const bytes = readFileSync(join(packageRoot, p));
      console.log(`# ${p}: ${kb(bytes.length)} raw, ${kb(gzipSync(bytes, { level: 9 }).length)} gzipped`);
    }
  });

  // Vite leaves an import or asset URL alone when told (`@vite-ignore`) or when its argument is
  // not a literal; webpack (Next.js among its users) warns "Critical dependency: the request of
  // a dependency is an expression" for each such Node-only path unless told `webpackIgnore`.
  test('its computed imports and asset URLs (Node-only paths) are marked for bundlers to leave alone', async () => {
    const { default: ts } = await import('typescript');
    const { files } = await packed();
    const unmarked: string[] = [];
    for (const path of files.map((f) => f.path).filter((p) => /^(dist|wasm)\/.+\.js$/.test(p))) {
      const text = readFileSync(join(packageRoot, path), 'utf8');
      const source = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.JS);
      const visit = (node: import('typescript').Node): void => {
        const call = ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword;
        const url = ts.isNewExpression(node) && node.expression.getText(source) === 'URL' && node.arguments?.[1]?.getText(source) === 'import.meta.url';
        const target = call || url ? (node as import('typescript').CallExpression | import('typescript').NewExpression).arguments?.[0] : undefined;
        if (target && !ts.isStringLiteralLike(target)) {
          // The comments between the opening parenthesis and the argument.
          if (!/webpackIgnore:\s*true/.test(text.slice(target.pos, target.getStart(source)))) {
            const { line } = source.getLineAndCharacterOfPosition(target.getStart(source));
            unmarked.push(`${path}:${line + 1}: ${node.getText(source)}`);
          }
        }
        ts.forEachChild(node, visit);
      };
      visit(source);
    }
    assert.deepEqual(unmarked, [], 'each needs /* webpackIgnore: true */ before its argument');
  });

  test('is not made from a stale build: a source changed after its build stops npm pack with the command that fixes it', async () => {
    await packed(); // the pack of the current build went through
    const source = join(packageRoot, 'src', 'signals.ts');
    const { atime, mtime } = statSync(source);
    utimesSync(source, atime, new Date(Date.now() + 60_000));
    try {
      const refused = await run(npm, ['pack', '--dry-run', '--json'], { cwd: packageRoot }).then(
        () => undefined,
        (error: { stderr?: string }) => error.stderr ?? '',
      );
      assert.ok(refused !== undefined, 'npm pack went through');
      assert.match(refused, /not packed, the build is missing or stale \(run `npm run build` in npm\/\):\n- src\/signals\.ts changed after dist\/signals\.js was built/);
    } finally {
      utimesSync(source, atime, mtime);
    }
  });

  test('its README generator keeps a "## " line inside a code fence in its section, and fails when its rewrite no longer applies', async () => {
    // A .mjs script without declarations: imported by a computed path, typed here.
    const script = new URL('../scripts/package-docs.mjs', import.meta.url).href;
    const { packageReadme } = (await import(script)) as { packageReadme: (readme: string) => string };
    const readme = '# T\nintro\n## Quick start\nrun\n## Using the package\n```sh\n## a comment, not a heading\n```\nsee `npm/src/stores/README.md` for why\n## Layout\nfiles\n';
    const made = packageReadme(readme);
    assert.match(made, /## a comment, not a heading\n```\nthe source repository's `npm\/src\/stores\/README\.md` explains why/);
    assert.doesNotMatch(made, /Quick start|Layout/);
    assert.throws(() => packageReadme(readme.replace('see `npm/src', 'read `npm/src')), /package-docs\.mjs/);
  });

  test("its runtime dependencies run on every Node its `engines` admits", async () => {
    const dir = await installedProject();
    const own = JSON.parse(readFileSync(join(dir, 'node_modules/crucible-agents/package.json'), 'utf8')) as { engines: { node: string }; dependencies: Record<string, string> };
    const floor = lowestAdmitted(own.engines.node);
    assert.ok(floor, `engines.node "${own.engines.node}" has the form >=x.y.z`);
    const problems: string[] = [];
    for (const dep of Object.keys(own.dependencies)) {
      const meta = JSON.parse(readFileSync(join(dir, 'node_modules', dep, 'package.json'), 'utf8')) as { version: string; engines?: { node?: string } };
      const range = meta.engines?.node;
      if (range === undefined) continue;
      const needs = lowestAdmitted(range);
      if (needs === undefined) problems.push(`${dep}@${meta.version}: engines.node "${range}" not understood`);
      else if (!atLeast(floor, needs)) problems.push(`${dep}@${meta.version} needs node ${range}, crucible-agents promises ${own.engines.node}`);
    }
    assert.deepEqual(problems, []);
  });

  describe('in a Node ESM project', () => {
    let llm: MockLlmServer;
    before(async () => {
      llm = await startMockLlmServer({ replies: [], respond: weatherResponder });
    });
    after(() => llm?.close());

    test('imports crucible-agents, runs a tool-calling conversation and prints the answer', async () => {
      const dir = await installedProject();
      writeFileSync(
        join(dir, 'index.mjs'),
        `import { createAgent, openai, tool } from 'crucible-agents';
const weather = tool({
  name: 'get_weather',
  description: 'Current temperature for a city',
  inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  execute: async ({ city }) => ({ city, celsius: 21 }),
});
const agent = await createAgent({
  model: openai({ baseURL: process.argv[2], apiKey: 'none', model: 'qwen', retry: { maxRetries: 0 } }),
  instructions: 'You are concise.',
  tools: [weather],
});
const types = [];
for await (const ev of agent.stream('What is the weather in Oslo?')) {
  if (ev.type === 'text.delta') process.stdout.write(ev.delta);
  else types.push(ev.type);
}
const { output } = await agent.run('And in Lima?', { signal: AbortSignal.timeout(60_000) });
console.log('\\n' + JSON.stringify({ types, output }));
`,
      );
      const { code, stdout, stderr } = await runNode('index.mjs', [llm.openaiBaseURL], dir);
      assert.equal(code, 0, stderr);
      const [streamed, summary] = stdout.trimEnd().split('\n');
      assert.equal(streamed, expectedAnswer);
      const { types, output } = JSON.parse(summary!) as { types: string[]; output: string };
      assert.deepEqual(types, ['agent.start', 'step.start', 'tool.call', 'tool.execute.start', 'tool.execute.end', 'step.end', 'step.start', 'step.end', 'agent.end']);
      assert.equal(output, expectedAnswer);
      assert.equal(llm.requests.length, 4);
    });

    // Issue 4 from the installed tarball: the sandbox Workers, the sandbox wasm and the registry
    // as the package ships them (dist/sandbox/worker.js, wasm/crucible_sandbox_bg.wasm).
    test('forges a sandbox tool and a compose tool, calls them, lists them, rejects a bad forge', async () => {
      const dir = await installedProject();
      writeFileSync(
        join(dir, 'emergent.mjs'),
        `import { createAgent, tool } from 'crucible-agents';
// Test double of the judge: a ModelProvider that approves every forge with fixed scores and
// counts how often it was asked.
let judged = 0;
const approvingJudge = {
  id: 'test-double:judge',
  async *stream() {
    judged++;
    yield { type: 'text', delta: ${JSON.stringify(JSON.stringify(APPROVING_VERDICT))} };
    yield { type: 'finish', finishReason: 'stop' };
  },
};
// Test double of the chat model: this script never runs the agent loop.
const unusedChat = {
  id: 'test-double:chat',
  async *stream() {
    throw new Error('the chat model is not asked in this script');
  },
};
const hostInputs = [];
const upperCase = tool({
  name: 'upper_case',
  description: 'Uppercases text',
  inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
  execute: async ({ text }) => {
    hostInputs.push(text);
    return { text: text.toUpperCase() };
  },
});
const agent = await createAgent({ model: unusedChat, tools: [upperCase], emergent: { enabled: true, judge: { model: approvingJudge } } });
const events = [];
agent.on((e) => events.push(e.type));
const slugify = ${JSON.stringify(SLUGIFY_FORGE)};
const brief = (r) => (r.success
  ? { success: true, tier: r.tool.tier, version: r.tool.version, mode: r.tool.mode, tests: r.tests.map((t) => t.passed) }
  : { success: false, category: r.category, reason: r.reason });
const forged = {
  slugify: brief(await agent.forge(slugify)),
  // A pipeline over the forged sandbox tool and the host tool.
  shoutSlug: brief(await agent.forge({
    name: 'shout_slug',
    description: 'Slugifies text, then uppercases the slug',
    inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
    outputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
    implementation: { mode: 'compose', steps: [
      { name: 'slug', tool: 'slugify', inputMapping: { text: '$input.text' } },
      { name: 'shout', tool: 'upper_case', inputMapping: { text: '$prev.slug' } },
    ] },
    testCases: [
      { input: { text: 'Hello World!' }, expectedOutput: { text: 'HELLO-WORLD' } },
      { input: { text: 'Rust & Wasm' }, expectedOutput: { text: 'RUST-WASM' } },
    ],
  })),
  // One test case where two are required: refused before any test or judge.
  oneTest: brief(await agent.forge({ ...slugify, name: 'one_test', testCases: [slugify.testCases[0]] })),
};
const judgedAfterForges = judged;
const calls = {
  slugify: await agent.tools.call('slugify', { text: 'Packed, Installed & Run!' }),
  shoutSlug: await agent.tools.call('shout_slug', { text: 'From the Tarball' }),
};
const listed = agent.tools.list().map((t) => ({ name: t.name, tier: t.tier, version: t.version, mode: t.mode, hash: t.hash, calls: t.stats.calls }));
const stats = agent.emergent.stats();
await agent.close();
console.log(JSON.stringify({ forged, judgedAfterForges, calls, listed, stats, events, hostInputs }));
`,
      );
      const { code, stdout, stderr } = await runNode('emergent.mjs', [], dir);
      assert.equal(code, 0, stderr);
      const result = JSON.parse(stdout) as {
        forged: Record<'slugify' | 'shoutSlug' | 'oneTest', { success: boolean; tier?: string; version?: number; mode?: string; tests?: boolean[]; category?: string; reason?: string }>;
        judgedAfterForges: number;
        calls: Record<'slugify' | 'shoutSlug', unknown>;
        listed: Array<{ name: string; tier: string; version: number; mode: string; hash: string; calls: number }>;
        stats: { attempts: number; approved: number; rejected: number; rejectionsByCategory: Record<string, number> };
        events: string[];
        hostInputs: string[];
      };
      const { forged, listed, stats } = result;
      assert.deepEqual(forged.slugify, { success: true, tier: 'session', version: 1, mode: 'sandbox', tests: [true, true] }, JSON.stringify(forged.slugify));
      assert.deepEqual(forged.shoutSlug, { success: true, tier: 'session', version: 1, mode: 'compose', tests: [true, true] }, JSON.stringify(forged.shoutSlug));
      assert.equal(forged.oneTest.success, false);
      assert.equal(forged.oneTest.category, 'shape_check', JSON.stringify(forged.oneTest));
      assert.match(forged.oneTest.reason!, /test case/);
      assert.equal(result.judgedAfterForges, 2, 'the judge reviewed the two forges that passed their tests, not the refused one');
      // The sandbox tool ran in the package's sandbox Worker; the pipeline called it and the host tool.
      assert.deepEqual(result.calls, { slugify: { slug: 'packed-installed-run' }, shoutSlug: { text: 'FROM-THE-TARBALL' } });
      // The forge's tests run concurrently, in either order; the call comes after them.
      const testInputs = result.hostInputs.slice(0, 2).sort();
      assert.deepEqual([...testInputs, ...result.hostInputs.slice(2)], ['hello-world', 'rust-wasm', 'from-the-tarball'], 'the host tool ran for both forge tests and the call');
      // slugify's 2 calls: the direct call and the pipeline's call. Forge tests are not uses,
      // neither of the tool itself nor of a pipeline's step tools.
      assert.deepEqual(
        listed.map(({ hash: _, ...rest }) => rest).sort((a, b) => a.name.localeCompare(b.name)),
        [
          { name: 'shout_slug', tier: 'session', version: 1, mode: 'compose', calls: 1 },
          { name: 'slugify', tier: 'session', version: 1, mode: 'sandbox', calls: 2 },
        ],
      );
      for (const t of listed) assert.match(t.hash, /^[0-9a-f]{64}$/, `${t.name} has a sha256 content hash`);
      assert.notEqual(listed[0]!.hash, listed[1]!.hash);
      assert.equal(stats.attempts, 3);
      assert.equal(stats.approved, 2);
      assert.equal(stats.rejected, 1);
      assert.equal(stats.rejectionsByCategory.shape_check, 1);
      const passed = ['forge.start', 'forge.test', 'forge.test', 'forge.judge', 'forge.registered'];
      assert.deepEqual(result.events, [...passed, ...passed, 'forge.start', 'forge.rejected']);
    });

    // The public API of issue 5 includes the stores: each platform's types must name its own.
    for (const [resolution, file, source] of [
      [
        'NodeNext (Node)',
        'check-node.ts',
        `import { createAgent, openai, tool, nodeStore, indexedDbStore, memoryStore, type AgentEvent } from 'crucible-agents';
const t = tool({ name: 'n', description: 'd', inputSchema: { type: 'object' }, execute: async () => 1 });
export async function go(): Promise<string> {
  const store = await nodeStore({ path: './.crucible' });
  const agent = await createAgent({ model: openai({ baseURL: 'http://127.0.0.1:1/v1', apiKey: 'x', model: 'm' }), tools: [t] });
  for await (const ev of agent.stream('hi')) {
    const e: AgentEvent = ev;
    if (e.type === 'text.delta') return e.delta;
  }
  void [store, indexedDbStore, memoryStore];
  const { output } = await agent.run('hi');
  return String(output);
}
`,
      ],
      [
        'Bundler (browser)',
        'check-browser.ts',
        `import { createAgent, openai, indexedDbStore, memoryStore } from 'crucible-agents';
export async function go(): Promise<unknown> {
  const store = indexedDbStore({ name: 'crucible' });
  await store.put('k', { v: 1 });
  void memoryStore;
  const agent = await createAgent({ model: openai({ baseURL: 'http://127.0.0.1:1/v1', apiKey: 'x', model: 'm' }) });
  return (await agent.run('hi')).output;
}
`,
      ],
      [
        // Bundler resolution picks the browser entry for the bare name: Node-only exports
        // (nodeStore) come from the platform's own subpath.
        'Bundler (Node, crucible-agents/node)',
        'check-node-bundler.ts',
        `import { createAgent, nodeStore, type NodeStoreOptions } from 'crucible-agents/node';
import { indexedDbStore } from 'crucible-agents/browser';
export async function go(): Promise<unknown> {
  const options: NodeStoreOptions = { path: './.crucible' };
  const store = await nodeStore(options);
  void indexedDbStore;
  const agent = await createAgent({ model: { id: 'x', async *stream() {} }, store });
  return agent.toolNames();
}
`,
      ],
    ] as const) {
      test(`its types check under TypeScript with ${resolution} resolution`, async () => {
        const dir = await installedProject();
        writeFileSync(join(dir, file), source);
        const tsc = join(packageRoot, 'node_modules/typescript/bin/tsc');
        const mode = file === 'check-node.ts' ? ['--module', 'nodenext', '--moduleResolution', 'nodenext'] : ['--module', 'esnext', '--moduleResolution', 'bundler'];
        const args = ['--noEmit', '--strict', '--skipLibCheck', '--target', 'es2022', ...mode, '--lib', 'es2022,dom', file];
        const { code, stdout, stderr } = await runNode(tsc, args, dir);
        assert.equal(code, 0, `tsc found errors:\n${stdout}${stderr}`);
        if (file !== 'check-browser.ts') {
          // A Node-only program has no DOM library, and may check libraries too: the package's
          // declarations must not need either.
          const nodeOnly = ['--noEmit', '--strict', '--target', 'es2022', ...mode, '--lib', 'es2022', '--typeRoots', join(packageRoot, 'node_modules/@types'), '--types', 'node', file];
          const strict = await runNode(tsc, nodeOnly, dir);
          assert.equal(strict.code, 0, `tsc (no DOM library, libraries checked) found errors:\n${strict.stdout}${strict.stderr}`);
        } else {
          // A browser program has no Node types (which declare Symbol.dispose) and may have an
          // ES2022 library (no esnext.disposable) and check libraries: the package's declarations
          // (wasm-bindgen's among them) must not need either.
          const config = 'tsconfig.browser-checked.json';
          const compilerOptions = { noEmit: true, strict: true, skipLibCheck: false, target: 'es2022', module: 'esnext', moduleResolution: 'bundler', lib: ['es2022', 'dom', 'dom.iterable'], types: [] };
          writeFileSync(join(dir, config), JSON.stringify({ compilerOptions, files: [file] }));
          const strict = await runNode(tsc, ['-p', config], dir);
          assert.equal(strict.code, 0, `tsc (no Node types, ES2022 library, libraries checked) found errors:\n${strict.stdout}${strict.stderr}`);
        }
      });
    }
  });
});

/**
 * Opens the weather app page with `?llm=`; waits until the app says it is done or failed,
 * asserts the streamed answer, the forged slugify tool's tests and output, and a clean
 * console, and saves a screenshot.
 */
async function assertWeatherAppWorks(browser: Browser, site: StaticServer, llm: MockLlmServer, path: string, shot: string): Promise<void> {
  llm.reset();
  const query = `llm=${encodeURIComponent(llm.openaiBaseURL)}&forge=${encodeURIComponent(JSON.stringify(SLUGIFY_FORGE))}`;
  const tab = await openPage(browser, `${site.url}${path}?${query}`);
  try {
    await tab.page.waitForSelector('#status[data-state="done"], #status[data-state="failed"]', { timeout: 45_000 });
    await tab.screenshot(shot);
    const state = await tab.page.getAttribute('#status', 'data-state');
    assert.equal(state, 'done', `${await tab.page.textContent('#status')}\n${tab.log.join('\n')}\nnot found: ${site.notFound.join(', ')}`);
    assert.equal(await tab.page.textContent('#answer'), expectedAnswer);
    const events = await tab.page.locator('#events li').allTextContents();
    assert.ok(events.filter((e) => e === 'text.delta').length > 1, 'the answer was streamed in several deltas');
    assert.deepEqual(events.filter((e) => e !== 'text.delta'), ['agent.start', 'step.start', 'tool.call', 'tool.execute.start', 'tool.execute.end', 'step.end', 'step.start', 'step.end', 'agent.end']);
    assert.equal(await tab.page.getAttribute('body', 'data-tool-city'), 'Oslo', 'the host tool ran in the page');
    assert.equal(llm.requests.length, 2, 'the forge asked the judge test double in the page, not the server');
    // slugify forged in the page: its tests and the call ran in the package's sandbox Worker.
    const forged = JSON.parse((await tab.page.textContent('#forged')) ?? '') as unknown;
    assert.deepEqual(forged, { success: true, tier: 'session', version: 1, tests: [true, true], output: { slug: 'forged-in-chromium' } });
    tab.assertClean();
  } finally {
    await tab.page.close();
  }
}

describeInBrowser('the packed tarball in Chromium', () => {
  let browser: Browser;
  let llm: MockLlmServer;
  const servers: StaticServer[] = [];

  before(async () => {
    llm = await startMockLlmServer({ replies: [], respond: weatherResponder });
    browser = await launchChromium();
  });
  after(async () => {
    await browser?.close();
    for (const s of servers) await s.close();
    await llm?.close();
  });

  test('bundled by Vite 7: vite build, serve dist/, the agent answers and forges a tool in the page', async () => {
    const app = await installedProject();
    const dir = join(work, 'vite-app');
    mkdirSync(dir);
    cpSync(join(app, 'node_modules'), join(dir, 'node_modules'), { recursive: true });
    writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'vite-app', private: true, type: 'module' }, null, 2));
    writeFileSync(join(dir, 'index.html'), readFileSync(join(pagesRoot, 'weather-app.html'), 'utf8'));
    cpSync(join(pagesRoot, 'weather-app.js'), join(dir, 'weather-app.js'));
    // Vite is this package's dev dependency; its CLI builds the app from the app's folder.
    const vite = join(packageRoot, 'node_modules/vite/bin/vite.js');
    const { code, stdout, stderr } = await runNode(vite, ['build', '--logLevel', 'warn'], dir);
    assert.equal(code, 0, `vite build failed:\n${stdout}\n${stderr}`);
    const assets = readdirSync(join(dir, 'dist/assets'));
    const wasm = assets.filter((f) => f.endsWith('.wasm'));
    // The core wasm once, and the sandbox wasm once (loaded only when a sandbox is created).
    assert.deepEqual(wasm.map((f) => f.replace(/-[\w-]+\.wasm$/, '')).sort(), ['crucible_core_bg', 'crucible_sandbox_bg'], `the bundle emits each wasm once as an asset: ${assets.join(', ')}`);
    console.log(`# vite bundle: ${assets.map((f) => `${f} ${kb(statSync(join(dir, 'dist/assets', f)).size)}`).join(', ')}`);
    const site = await startStaticServer({ mounts: { '/': join(dir, 'dist') } });
    servers.push(site);
    await assertWeatherAppWorks(browser, site, llm, '/', 'packaging-vite');
  });

  test('as a plain ES module page: an import map points at the installed dist/browser.js; the agent answers and forges a tool', async () => {
    const app = await installedProject();
    // Where a browser loads each bare specifier from: each package.json's `exports['.']`
    // resolved with the conditions a browser import uses, as a bundler would.
    const conditions = ['browser', 'import', 'default'];
    const pick = (node: unknown): string | undefined => {
      if (typeof node === 'string') return node;
      if (node === null || typeof node !== 'object') return undefined;
      for (const [key, value] of Object.entries(node)) if (conditions.includes(key)) return pick(value);
      return undefined;
    };
    const esmEntry = (name: string): string => {
      const meta = JSON.parse(readFileSync(join(app, 'node_modules', name, 'package.json'), 'utf8')) as { exports: Record<string, unknown> };
      const target = pick(meta.exports['.']);
      assert.ok(target, `${name} exports a browser/import entry`);
      return `/node_modules/${name}/${target.replace(/^\.\//, '')}`;
    };
    const importMap = { imports: { 'crucible-agents': esmEntry('crucible-agents'), 'eventsource-parser': esmEntry('eventsource-parser') } };
    const html = readFileSync(join(pagesRoot, 'weather-app.html'), 'utf8').replace(
      '<!--IMPORTMAP-->',
      `<script type="importmap">${JSON.stringify(importMap)}</script>`,
    );
    const site = await startStaticServer({
      mounts: { '/node_modules/': join(app, 'node_modules') },
      files: { '/': html, '/weather-app.js': readFileSync(join(pagesRoot, 'weather-app.js')) },
    });
    servers.push(site);
    await assertWeatherAppWorks(browser, site, llm, '/', 'packaging-importmap');
  });
});
