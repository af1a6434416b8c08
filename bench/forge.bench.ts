/**
 * Forge benchmark: Crucible against the main peer, @framers/agentos (0.9.x), in the same run.
 *
 * Both engines forge the same four tools with a deterministic, in-process judge that approves
 * (no HTTP, no LLM: the judge costs next to nothing for both):
 *
 *   slugify, parse_csv, convert_temperature — sandbox mode, code exactly as in issue 3, two
 *                                              test cases with expected outputs each
 *   shout                                    — compose mode: host tool `upper` ($input.text)
 *                                              then host tool `exclaim` ($prev.text)
 *
 * Each tool is forged 20 times per engine under unique names (slugify_0..slugify_19, …), then
 * each engine invokes each tool 1,000 times (cycling over the 20 forged copies). Forges and
 * calls interleave the two engines (alternating which goes first), after a warm-up that is
 * not measured. Prints the median forge latency and the median invocation latency per tool and
 * engine and the ratios Crucible / agentos. Bars: forge ≤ 0.5×, invocation ≤ 1.0×.
 *
 * The warm-up (50 forges per tool and engine) measures the steady state. A process's first
 * sandbox forges are slower: V8 runs the sandbox's wasm (Boa's parser and compiler, in the
 * Worker) in its baseline tier until it has run enough to be optimized, which takes some tens
 * of forges. BENCH_WARMUP_FORGES=3 shows those first forges.
 *
 * What each side runs:
 *   Crucible — `agent.forge(request, { sessionId })` (shape check, tests in the sandbox Worker
 *              pool, judge via a `ModelProvider`, registry) and `agent.tools.call(name, args,
 *              { sessionId })`.
 *   agentos  — `EmergentCapabilityEngine.forge(request, { agentId, sessionId })` wired as its
 *              docs do (SandboxedToolForge → CodeSandbox on node:vm, ComposableToolBuilder,
 *              EmergentJudge with a `generateText` callback, EmergentToolRegistry), and the
 *              executable from `createExecutableTool` (delivered by `onToolForged`) `.execute()`.
 *
 * Run: cd npm && npm run bench:forge   (= node --import tsx ../bench/forge.bench.ts)
 * Env: BENCH_FORGES (default 20), BENCH_CALLS (default 1000), BENCH_WARMUP_FORGES (default
 *      50), BENCH_ONLY=crucible|agentos
 *      (profile one engine: node --cpu-prof --import tsx ../bench/forge.bench.ts),
 *      BENCH_TOOLS=shout,slugify (a subset of the four tools).
 */

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, loadavg } from 'node:os';
import { isDeepStrictEqual } from 'node:util';
import { pathToFileURL } from 'node:url';
import { createAgent, tool, type ForgeRequest, type ModelProvider } from '../npm/src/node.js';
import { SLUGIFY_FORGE } from '../npm/test/support/forge-fixtures.js';

// Dev dependencies live in npm/node_modules; resolve them from there, not from bench/.
const fromNpm = createRequire(new URL('../npm/package.json', import.meta.url));
const resolveIn = (spec: string) => fromNpm.resolve(spec);
type EmergentModule = typeof import('../npm/node_modules/@framers/agentos/dist/cognition/emergent/index.js');
const ao = (await import(pathToFileURL(resolveIn('@framers/agentos/emergent')).href)) as EmergentModule;
const agentosVersion = (() => {
  const main = resolveIn('@framers/agentos/emergent');
  const root = main.slice(0, main.lastIndexOf('node_modules/@framers/agentos/') + 'node_modules/@framers/agentos/'.length);
  return (JSON.parse(readFileSync(`${root}package.json`, 'utf8')) as { version: string }).version;
})();

const FORGES = Number(process.env.BENCH_FORGES ?? 20);
const CALLS = Number(process.env.BENCH_CALLS ?? 1000);
const WARMUP_FORGES = Number(process.env.BENCH_WARMUP_FORGES ?? 50);
const WARMUP_CALLS = 100;
const ONLY = process.env.BENCH_ONLY as 'crucible' | 'agentos' | undefined;
const SESSION = 'bench';

// ---------------------------------------------------------------------------------------------
// The four tools (one spec, used verbatim by both engines)

const str = { type: 'string' } as const;
const textSchema = { type: 'object', properties: { text: str }, required: ['text'] };

interface Spec {
  base: string;
  request: Omit<ForgeRequest, 'name'>;
  call: Record<string, unknown>;
  expect: unknown;
}

const SPECS: Spec[] = [
  {
    base: 'slugify',
    // The tests' fixture: the issue-3 code with two test cases (its name is replaced per forge).
    request: SLUGIFY_FORGE,
    call: { text: 'Hello, World! This is Crucible -- forging tools 2024' },
    expect: { slug: 'hello-world-this-is-crucible-forging-tools-2024' },
  },
  {
    base: 'parse_csv',
    request: {
      description: 'Parse CSV text into headers and row objects',
      inputSchema: { type: 'object', properties: { csv: str, delimiter: str }, required: ['csv'] },
      outputSchema: {
        type: 'object',
        properties: { headers: { type: 'array', items: str }, rows: { type: 'array', items: { type: 'object' } } },
        required: ['headers', 'rows'],
      },
      implementation: {
        mode: 'sandbox',
        code: "function execute(input){const d=input.delimiter||',';const l=input.csv.trim().split('\\n');const h=l[0].split(d).map(x=>x.trim());return {headers:h,rows:l.slice(1).map(r=>{const v=r.split(d);return Object.fromEntries(h.map((k,i)=>[k,v[i]?.trim()]))})};}",
      },
      testCases: [
        { input: { csv: 'a,b\n1,2' }, expectedOutput: { headers: ['a', 'b'], rows: [{ a: '1', b: '2' }] } },
        { input: { csv: 'x; y\n3; 4\n5; 6', delimiter: ';' }, expectedOutput: { headers: ['x', 'y'], rows: [{ x: '3', y: '4' }, { x: '5', y: '6' }] } },
      ],
    },
    call: { csv: 'name, age, city\nAda, 36, London\nAlan, 41, Manchester\nGrace, 85, Arlington\nLinus, 54, Portland' },
    expect: {
      headers: ['name', 'age', 'city'],
      rows: [
        { name: 'Ada', age: '36', city: 'London' },
        { name: 'Alan', age: '41', city: 'Manchester' },
        { name: 'Grace', age: '85', city: 'Arlington' },
        { name: 'Linus', age: '54', city: 'Portland' },
      ],
    },
  },
  {
    base: 'convert_temperature',
    request: {
      description: 'Convert a temperature between C, F and K',
      inputSchema: {
        type: 'object',
        properties: { value: { type: 'number' }, from: { type: 'string', enum: ['C', 'F', 'K'] }, to: { type: 'string', enum: ['C', 'F', 'K'] } },
        required: ['value', 'from', 'to'],
      },
      outputSchema: { type: 'object', properties: { result: { type: 'number' } }, required: ['result'] },
      implementation: {
        mode: 'sandbox',
        code: "function execute(input){const {value,from,to}=input;let c=from==='C'?value:from==='F'?(value-32)*5/9:value-273.15;let r=to==='C'?c:to==='F'?c*9/5+32:c+273.15;return {result:Math.round(r*100)/100};}",
      },
      testCases: [
        { input: { value: 100, from: 'C', to: 'F' }, expectedOutput: { result: 212 } },
        { input: { value: 32, from: 'F', to: 'C' }, expectedOutput: { result: 0 } },
      ],
    },
    call: { value: 98.6, from: 'F', to: 'C' },
    expect: { result: 37 },
  },
  {
    base: 'shout',
    request: {
      description: 'Uppercase the text, then add an exclamation mark',
      inputSchema: textSchema,
      outputSchema: { type: 'object', properties: { text: str }, required: ['text'] },
      implementation: {
        mode: 'compose',
        steps: [
          { name: 'up', tool: 'upper', inputMapping: { text: '$input.text' } },
          { name: 'bang', tool: 'exclaim', inputMapping: { text: '$prev.text' } },
        ],
      },
      testCases: [
        { input: { text: 'hello' }, expectedOutput: { text: 'HELLO!' } },
        { input: { text: 'forge it' }, expectedOutput: { text: 'FORGE IT!' } },
      ],
    },
    call: { text: 'crucible forges tools' },
    expect: { text: 'CRUCIBLE FORGES TOOLS!' },
  },
];

if (process.env.BENCH_TOOLS) {
  const keep = new Set(process.env.BENCH_TOOLS.split(','));
  SPECS.splice(0, SPECS.length, ...SPECS.filter((s) => keep.has(s.base)));
}

// The two host tools behind the compose tool (same functions for both engines).
const HOST = {
  upper: ({ text }: { text: string }) => ({ text: text.toUpperCase() }),
  exclaim: ({ text }: { text: string }) => ({ text: `${text}!` }),
};

// ---------------------------------------------------------------------------------------------
// Engines

interface Engine {
  name: 'crucible' | 'agentos';
  forge(name: string, spec: Spec): Promise<void>;
  call(name: string, args: Record<string, unknown>): Promise<unknown>;
  close(): Promise<void>;
}

const VERDICT_CRUCIBLE =
  '{"approved":true,"safety":1,"correctness":1,"determinism":1,"boundedness":1,"confidence":0.95,"reasoning":"bench"}';
const VERDICT_AGENTOS =
  '{"safety":{"passed":true,"concerns":[]},"correctness":{"passed":true,"failedTests":[]},"determinism":{"likely":true,"reasoning":""},"bounded":{"likely":true,"reasoning":""},"confidence":0.95,"approved":true,"reasoning":"bench"}';
const NEVER_PROMOTE = { uses: 1e9, confidence: 1 };

async function crucibleEngine(): Promise<Engine> {
  const judge: ModelProvider = {
    id: 'bench:judge',
    async *stream() {
      yield { type: 'text', delta: VERDICT_CRUCIBLE };
      yield { type: 'finish', finishReason: 'stop' };
    },
  };
  const agent = await createAgent({
    model: judge, // never asked: the bench forges and calls directly
    agentId: 'bench',
    tools: [
      tool({ name: 'upper', description: 'Uppercases text', inputSchema: textSchema, execute: HOST.upper }),
      tool({ name: 'exclaim', description: 'Appends an exclamation mark', inputSchema: textSchema, execute: HOST.exclaim }),
    ],
    emergent: { enabled: true, judge: { model: judge }, maxSessionTools: 10_000, maxAgentTools: 10_000, promotionThreshold: NEVER_PROMOTE },
  });
  return {
    name: 'crucible',
    async forge(name, spec) {
      const res = await agent.forge({ ...spec.request, name } as ForgeRequest, { sessionId: SESSION });
      if (!res.success) throw new Error(`crucible forge ${name}: ${JSON.stringify(res)}`);
    },
    call: (name, args) => agent.tools.call(name, args, { sessionId: SESSION }),
    close: () => agent.close(),
  };
}

async function agentosEngine(): Promise<Engine> {
  type Exec = { execute(args: unknown, ctx: unknown): Promise<{ success: boolean; output?: unknown; error?: string }> };
  const config = {
    ...ao.DEFAULT_EMERGENT_CONFIG,
    enabled: true,
    allowSandboxTools: true,
    maxSessionTools: 10_000,
    maxAgentTools: 10_000,
    promotionThreshold: NEVER_PROMOTE,
  };
  const host = HOST as Record<string, (a: { text: string }) => unknown>;
  const executables = new Map<string, Exec>();
  const engine = new ao.EmergentCapabilityEngine({
    config,
    composableBuilder: new ao.ComposableToolBuilder(async (name, args) => {
      const fn = host[name];
      return fn ? { success: true, output: fn(args as { text: string }) } : { success: false, error: `unknown tool ${name}` };
    }),
    sandboxForge: new ao.SandboxedToolForge({ memoryMB: config.sandboxMemoryMB, timeoutMs: config.sandboxTimeoutMs }),
    judge: new ao.EmergentJudge({ judgeModel: 'bench', promotionModel: 'bench', generateText: async () => VERDICT_AGENTOS }),
    registry: new ao.EmergentToolRegistry(config),
    onToolForged: async (t, executable) => {
      executables.set(t.name, executable as unknown as Exec);
    },
  });
  const ctx = { gmiId: 'bench', personaId: 'bench', userContext: { userId: 'bench' }, correlationId: SESSION, sessionId: SESSION };
  return {
    name: 'agentos',
    async forge(name, spec) {
      // agentos requires the (empty) API allowlist on sandbox implementations.
      const impl = spec.request.implementation;
      const implementation = impl.mode === 'sandbox' ? { ...impl, allowlist: [] } : impl;
      const res = await engine.forge({ ...spec.request, implementation, name } as never, { agentId: 'bench', sessionId: SESSION });
      if (!res.success) throw new Error(`agentos forge ${name}: ${JSON.stringify(res)}`);
    },
    async call(name, args) {
      const res = await executables.get(name)!.execute(args, ctx);
      if (!res.success) throw new Error(`agentos call ${name}: ${res.error}`);
      return res.output;
    },
    close: async () => {},
  };
}

// ---------------------------------------------------------------------------------------------
// Measurement

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const us = (ms: number) => `${(ms * 1000).toFixed(1)} µs`;
const msf = (ms: number) => `${ms.toFixed(3)} ms`;

const engines: Engine[] = [];
if (ONLY !== 'agentos') engines.push(await crucibleEngine());
if (ONLY !== 'crucible') engines.push(await agentosEngine());
const order = (round: number) => (round % 2 ? [...engines].reverse() : engines);

// Warm-up: forges and calls under names that are not measured.
for (let w = 0; w < WARMUP_FORGES; w++) {
  for (const spec of SPECS) for (const e of order(w)) await e.forge(`warm_${spec.base}_${w}`, spec);
}
for (let w = 0; w < WARMUP_CALLS; w++) {
  for (const spec of SPECS) for (const e of order(w)) await e.call(`warm_${spec.base}_${w % WARMUP_FORGES}`, spec.call);
}

const forgeMs = new Map<string, number[]>();
const callMs = new Map<string, number[]>();
const key = (e: Engine, spec: Spec) => `${e.name}:${spec.base}`;
for (const e of engines) for (const spec of SPECS) {
  forgeMs.set(key(e, spec), []);
  callMs.set(key(e, spec), []);
}

for (let i = 0; i < FORGES; i++) {
  for (const spec of SPECS) {
    for (const e of order(i)) {
      const t0 = performance.now();
      await e.forge(`${spec.base}_${i}`, spec);
      forgeMs.get(key(e, spec))!.push(performance.now() - t0);
    }
  }
}

// Both engines must compute the same, expected outputs.
for (const spec of SPECS) {
  for (const e of engines) {
    const out = await e.call(`${spec.base}_0`, spec.call);
    if (!isDeepStrictEqual(out, spec.expect)) throw new Error(`${e.name} ${spec.base}: ${JSON.stringify(out)}`);
  }
}

for (let i = 0; i < CALLS; i++) {
  for (const spec of SPECS) {
    const name = `${spec.base}_${i % FORGES}`;
    for (const e of order(i)) {
      const t0 = performance.now();
      await e.call(name, spec.call);
      callMs.get(key(e, spec))!.push(performance.now() - t0);
    }
  }
}

for (const e of engines) await e.close();

// ---------------------------------------------------------------------------------------------
// Report

console.log(`forge bench — node ${process.version}, ${cpus().length} CPUs, load ${loadavg().map((l) => l.toFixed(2)).join(' ')}`);
console.log(`crucible-agents (this tree) vs @framers/agentos ${agentosVersion}; ${FORGES} forges and ${CALLS} calls per tool and engine after ${WARMUP_FORGES} warm-up forges, medians`);
console.log('');
const rows: string[][] = [['tool', 'mode', 'forge crucible', 'forge agentos', 'ratio (≤0.5)', 'call crucible', 'call agentos', 'ratio (≤1.0)']];
let pass = true;
for (const spec of SPECS) {
  const get = (m: Map<string, number[]>, n: string) => {
    const xs = m.get(`${n}:${spec.base}`);
    return xs && xs.length ? median(xs) : NaN;
  };
  const fc = get(forgeMs, 'crucible');
  const fa = get(forgeMs, 'agentos');
  const cc = get(callMs, 'crucible');
  const ca = get(callMs, 'agentos');
  const fr = fc / fa;
  const cr = cc / ca;
  if (!(fr <= 0.5) || !(cr <= 1.0)) pass = false;
  rows.push([
    spec.base,
    spec.request.implementation.mode,
    msf(fc),
    msf(fa),
    `${fr.toFixed(2)}×${fr <= 0.5 ? '' : ' ✗'}`,
    us(cc),
    us(ca),
    `${cr.toFixed(2)}×${cr <= 1.0 ? '' : ' ✗'}`,
  ]);
}
const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
for (const r of rows) console.log(r.map((cell, c) => (c < 2 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  '));
if (engines.length === 2) console.log(`\nbars ${pass ? 'met' : 'NOT met'} (forge ≤ 0.5×, invocation ≤ 1.0× for every tool)`);
