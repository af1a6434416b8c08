/**
 * Sandbox benchmark: the three tools from issue 3, each executed 1,000 times, median per-call
 * latency for this sandbox (warm pool) against the named baseline `node:vm` with a fresh
 * context per call, plus quickjs-emscripten (fresh context) and isolated-vm (fresh context,
 * when it is installed: it needs a native build, so it is not a devDependency — point
 * ISOLATED_VM_PATH at an installed copy). Prints ratios from one run, the time to replace a
 * killed worker, and the gzipped size of what the Worker loads.
 *
 *   npm run build:wasm && npm run build:ts && npm run bench:sandbox
 */
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import vm from 'node:vm';
import { gzipSync } from 'node:zlib';

const CALLS = Number(process.env.BENCH_CALLS ?? 1000);
const WARMUP = 100;

const TOOLS = [
  {
    name: 'slugify',
    code: "function execute(input){const s=input.text.toLowerCase().replace(/[^a-z0-9]+/g,'-').replace(/^-|-$/g,'');return {slug:s};}",
    input: { text: 'Hello, World! This is Crucible -- forging tools 2024' },
  },
  {
    name: 'csv',
    code: "function execute(input){const d=input.delimiter||',';const l=input.csv.trim().split('\\n');const h=l[0].split(d).map(x=>x.trim());return {headers:h,rows:l.slice(1).map(r=>{const v=r.split(d);return Object.fromEntries(h.map((k,i)=>[k,v[i]?.trim()]))})};}",
    input: { csv: 'name, age, city\nAda, 36, London\nAlan, 41, Manchester\nGrace, 85, Arlington\nLinus, 54, Portland' },
  },
  {
    name: 'temperature',
    code: "function execute(input){const {value,from,to}=input;let c=from==='C'?value:from==='F'?(value-32)*5/9:value-273.15;let r=to==='C'?c:to==='F'?c*9/5+32:c+273.15;return {result:Math.round(r*100)/100};}",
    input: { value: 98.6, from: 'F', to: 'C' },
  },
];

type Runner = (code: string, input: unknown) => Promise<unknown> | unknown;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

async function measure(run: Runner, code: string, input: unknown): Promise<{ median: number; output: unknown }> {
  let output: unknown;
  for (let i = 0; i < WARMUP; i++) output = await run(code, input);
  const times: number[] = [];
  for (let i = 0; i < CALLS; i++) {
    const t = performance.now();
    output = await run(code, input);
    times.push(performance.now() - t);
  }
  return { median: median(times), output };
}

// ---- contenders ----

const distIndex = new URL('../dist/sandbox/index.js', import.meta.url);
const fromDist = existsSync(distIndex) && !process.argv.includes('--source');
const { createSandbox } = (await import(fromDist ? distIndex.href : '../src/sandbox/index.js')) as typeof import('../src/sandbox/index.js');
const sandbox = await createSandbox({ poolSize: 2, timeoutMs: 5000, memoryMB: 128 });
const crucible: Runner = async (code, input) => {
  const r = await sandbox.execute({ code, input });
  if (r.status !== 'ok') throw new Error(JSON.stringify(r));
  return r.output;
};

const nodeVm: Runner = (code, input) => {
  const context = vm.createContext({ __input: JSON.stringify(input) });
  const out = vm.runInContext(`${code}\n;JSON.stringify(execute(JSON.parse(__input)))`, context, { timeout: 5000 });
  return JSON.parse(out as string);
};

const { getQuickJS } = await import('quickjs-emscripten');
const QuickJS = await getQuickJS();
const quickjs: Runner = (code, input) => {
  const ctx = QuickJS.newContext();
  try {
    const result = ctx.evalCode(`${code}\n;JSON.stringify(execute(${JSON.stringify(input)}))`);
    const handle = ctx.unwrapResult(result);
    const out = ctx.getString(handle);
    handle.dispose();
    return JSON.parse(out);
  } finally {
    ctx.dispose();
  }
};

let isolatedVm: Runner | undefined;
let isolatedVmNote = '';
try {
  const require = createRequire(import.meta.url);
  const ivm = require(process.env.ISOLATED_VM_PATH ?? 'isolated-vm') as typeof import('isolated-vm');
  const isolate = new ivm.Isolate({ memoryLimit: 128 });
  isolatedVm = async (code, input) => {
    const context = await isolate.createContext();
    try {
      const out = await context.eval(`${code}\n;JSON.stringify(execute(${JSON.stringify(input)}))`, { timeout: 5000 });
      return JSON.parse(out as string);
    } finally {
      context.release();
    }
  };
} catch (error) {
  isolatedVmNote = `isolated-vm unavailable (${error instanceof Error ? error.message.split('\n')[0] : error})`;
}

// ---- run ----

const contenders: Array<[string, Runner | undefined]> = [
  ['crucible sandbox (warm pool)', crucible],
  ['node:vm fresh context', nodeVm],
  ['quickjs-emscripten fresh context', quickjs],
  ['isolated-vm fresh context', isolatedVm],
];

console.log(`sandbox benchmark: ${CALLS} calls per tool, median per-call latency (ms); loaded from ${fromDist ? 'dist/' : 'src/ (tsx)'}`);
console.log(`node ${process.version}, ${process.platform}/${process.arch}`);
const rows: string[][] = [['tool', ...contenders.map(([n]) => n), 'crucible / node:vm']];
for (const tool of TOOLS) {
  const medians: Array<number | undefined> = [];
  let reference: string | undefined;
  for (const [, run] of contenders) {
    if (!run) {
      medians.push(undefined);
      continue;
    }
    const { median: m, output } = await measure(run, tool.code, tool.input);
    const text = JSON.stringify(output);
    reference ??= text;
    if (text !== reference) throw new Error(`${tool.name}: outputs differ: ${text} vs ${reference}`);
    medians.push(m);
  }
  const ratio = medians[0]! / medians[1]!;
  rows.push([tool.name, ...medians.map((m) => (m === undefined ? 'n/a' : m.toFixed(3))), `${ratio.toFixed(2)}x`]);
}
const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
for (const r of rows) console.log(r.map((c, i) => c.padEnd(widths[i]!)).join('  '));
if (isolatedVmNote) console.log(isolatedVmNote);

// Replacement of a killed worker: a runaway loop, the deadline kill, then a ready replacement.
{
  const small = await createSandbox({ poolSize: 1, timeoutMs: 200 });
  const kills: number[] = [];
  for (let i = 0; i < 5; i++) {
    await small.execute({ code: 'function execute(){ for(;;){} }' });
    const before = small.stats().lastReplacementMs;
    const t = performance.now();
    const r = await small.execute({ code: 'function execute(){ return 1; }' });
    if (r.status !== 'ok') throw new Error(JSON.stringify(r));
    kills.push(small.stats().lastReplacementMs ?? before ?? performance.now() - t);
  }
  console.log(`replace a killed worker (kill → replacement ready), median of 5: ${median(kills).toFixed(1)} ms`);
  await small.close();
}

// What the Worker loads.
{
  const files = [
    new URL('../wasm/crucible_sandbox_bg.wasm', import.meta.url),
    new URL('../wasm/crucible_sandbox.js', import.meta.url),
    new URL(fromDist ? '../dist/sandbox/worker.js' : '../src/sandbox/worker.ts', import.meta.url),
  ];
  let raw = 0;
  let gz = 0;
  for (const f of files) {
    const bytes = readFileSync(f);
    raw += bytes.length;
    gz += gzipSync(bytes, { level: 9 }).length;
  }
  console.log(`worker payload (wasm + glue + worker script): ${(raw / 1048576).toFixed(2)} MiB raw, ${(gz / 1048576).toFixed(2)} MiB gzipped`);
}

await sandbox.close();
