/**
 * The store benchmark body, free of Node APIs so a browser bundle can run it too (the
 * Chromium IndexedDB numbers come from there). It persists then reloads realistic records:
 * 1,000 forged-tool records (~2 KB JSON each) and 100 run states (~20 KB each).
 *
 * Phases, each timed per store (median of `rounds`, after one warm-up round):
 *   tools put   — 1,000 sequential awaited `put`s (a registry saving tools one by one)
 *   runs put    — 100 sequential awaited `put`s of run states
 *   tools batch — the same 1,000 tool records rewritten as 10 batches of 100
 *   reload      — close, reopen, `scan('tool/')` + `scan('run/')`, checked complete
 */

import type { BatchOp, JsonValue, Store } from '../npm/src/stores/types.js';

/** One store under test: `create` gives a fresh, empty store and a way to reopen its data. */
export interface BenchSubject {
  name: string;
  /** Marks the baseline the ratios are computed against (one per group). */
  baselineOf?: string;
  /** Group for ratios: rows of a group are compared with the group's baseline. */
  group?: string;
  create(): Promise<{ store: Store; reopen?: () => Promise<Store> }>;
}

/** Median timings in milliseconds for one subject. */
export interface BenchRow {
  name: string;
  group: string | undefined;
  baseline: boolean;
  toolsPutMs: number;
  runsPutMs: number;
  toolsBatchMs: number;
  reloadMs: number;
  totalMs: number;
}

export const TOOL_COUNT = 1000;
export const RUN_COUNT = 100;

/** A forged-tool record like the registry keeps (~2 KB as JSON). */
export function toolRecord(i: number): JsonValue {
  const name = `tool_${i}_normalize_invoice_lines`;
  return {
    v: 1,
    name,
    version: 3,
    tier: i % 3 === 0 ? 'trusted' : 'probation',
    description: `Normalizes invoice line items for tool ${i}: trims, parses amounts, maps currency codes.`,
    inputSchema: {
      type: 'object',
      properties: {
        lines: { type: 'array', items: { type: 'object', properties: { text: { type: 'string' }, qty: { type: 'number' } } } },
        currency: { type: 'string', enum: ['EUR', 'USD', 'GBP'] },
      },
      required: ['lines'],
    },
    outputSchema: { type: 'object', properties: { total: { type: 'number' }, items: { type: 'array' } } },
    code:
      `export default function run(input) {\n` +
      `  const items = input.lines.map((l, n) => ({ n, text: l.text.trim(), qty: Number(l.qty) || 0 }));\n`.repeat(8) +
      `  return { total: items.reduce((s, it) => s + it.qty, 0), items };\n}\n`,
    hash: `sha256-${(i * 2654435761).toString(16).padStart(16, '0').repeat(4)}`,
    provenance: { forgedBy: 'agent/planner', fromRequest: `req-${i}`, verdicts: ['tests:pass', 'judge:approve'] },
    stats: { calls: i * 7, failures: i % 5, p50Ms: 1.25, p95Ms: 4.5, lastUsed: 1_700_000_000_000 + i },
  };
}

/** A paused run state (~20 KB as JSON): a conversation with tool calls. */
export function runState(i: number): JsonValue {
  const messages: JsonValue[] = [];
  for (let m = 0; m < 30; m++) {
    messages.push({
      role: m % 3 === 0 ? 'user' : m % 3 === 1 ? 'assistant' : 'tool',
      content: `Run ${i} message ${m}: `.padEnd(520, 'lorem ipsum dolor sit amet '),
      toolCalls: m % 3 === 1 ? [{ id: `call_${i}_${m}`, name: `tool_${m}`, arguments: { lines: [{ text: 'a', qty: 1 }] } }] : [],
    });
  }
  return { v: 1, id: `run-${i}`, status: 'awaiting_approval', turn: 12, messages, usage: { input: 12345, output: 678 } };
}

const toolKey = (i: number): string => `tool/${String(i).padStart(5, '0')}`;
const runKey = (i: number): string => `run/${String(i).padStart(4, '0')}`;

const now = (): number => performance.now();

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1]!;
}

async function oneRound(subject: BenchSubject, tools: JsonValue[], runs: JsonValue[]): Promise<Omit<BenchRow, 'name' | 'group' | 'baseline'>> {
  const { store, reopen } = await subject.create();
  let t = now();
  for (let i = 0; i < tools.length; i++) await store.put(toolKey(i), tools[i]!);
  const toolsPutMs = now() - t;

  t = now();
  for (let i = 0; i < runs.length; i++) await store.put(runKey(i), runs[i]!);
  const runsPutMs = now() - t;

  t = now();
  for (let start = 0; start < tools.length; start += 100) {
    const ops: BatchOp[] = [];
    for (let i = start; i < Math.min(start + 100, tools.length); i++) ops.push({ type: 'put', key: toolKey(i), value: tools[i]! });
    await store.batch(ops);
  }
  const toolsBatchMs = now() - t;

  t = now();
  let reader = store;
  if (reopen) {
    await store.close();
    reader = await reopen();
  }
  const loadedTools = await reader.scan('tool/');
  const loadedRuns = await reader.scan('run/');
  const reloadMs = now() - t;
  if (loadedTools.length !== tools.length || loadedRuns.length !== runs.length) {
    throw new Error(`${subject.name}: reloaded ${loadedTools.length} tools and ${loadedRuns.length} runs`);
  }
  if (JSON.stringify(loadedRuns[7]![1]) !== JSON.stringify(runs[7])) throw new Error(`${subject.name}: run 7 differs`);
  await reader.close();
  return { toolsPutMs, runsPutMs, toolsBatchMs, reloadMs, totalMs: toolsPutMs + runsPutMs + toolsBatchMs + reloadMs };
}

/**
 * Runs every subject once to warm up, then `rounds` times in turn (a fresh store each time),
 * and returns median timings.
 * `makeStores` is called once; subjects must create independent stores on each `create`.
 */
export async function runStoreBench(
  makeStores: () => BenchSubject[] | Promise<BenchSubject[]>,
  options: { rounds?: number; log?: (line: string) => void } = {},
): Promise<BenchRow[]> {
  const rounds = options.rounds ?? 3;
  const tools = Array.from({ length: TOOL_COUNT }, (_, i) => toolRecord(i));
  const runs = Array.from({ length: RUN_COUNT }, (_, i) => runState(i));
  const subjects = await makeStores();
  // One discarded warm-up round each (JIT, first-open costs), then rounds in turn across
  // subjects so that neither warm-up nor background load favours whoever runs later.
  for (const subject of subjects) await oneRound(subject, tools, runs);
  const results = subjects.map((): Array<Awaited<ReturnType<typeof oneRound>>> => []);
  for (let r = 0; r < rounds; r++) {
    for (const [n, subject] of subjects.entries()) results[n]!.push(await oneRound(subject, tools, runs));
  }
  const rows = subjects.map((subject, n): BenchRow => {
    const pick = (k: keyof Awaited<ReturnType<typeof oneRound>>): number => median(results[n]!.map((x) => x[k]));
    return {
      name: subject.name,
      group: subject.group,
      baseline: subject.baselineOf !== undefined,
      toolsPutMs: pick('toolsPutMs'),
      runsPutMs: pick('runsPutMs'),
      toolsBatchMs: pick('toolsBatchMs'),
      reloadMs: pick('reloadMs'),
      totalMs: pick('totalMs'),
    };
  });
  for (const row of rows) options.log?.(`${row.name}: total ${row.totalMs.toFixed(1)} ms`);
  return rows;
}

/** A plain-text table of the rows, with each row's total as a ratio of its group's baseline. */
export function formatStoreBench(rows: BenchRow[]): string {
  const head = ['store', 'tools put ×1000', 'runs put ×100', 'tools batch 10×100', 'reopen+reload', 'total', 'vs baseline'];
  const body = rows.map((r) => {
    const base = rows.find((b) => b.baseline && b.group !== undefined && b.group === r.group);
    const ratio = base === undefined ? '' : r === base ? 'baseline' : `${(r.totalMs / base.totalMs).toFixed(2)}×`;
    const ms = (x: number): string => `${x.toFixed(1)} ms`;
    return [r.name, ms(r.toolsPutMs), ms(r.runsPutMs), ms(r.toolsBatchMs), ms(r.reloadMs), ms(r.totalMs), ratio];
  });
  const widths = head.map((h, c) => Math.max(h.length, ...body.map((row) => row[c]!.length)));
  const line = (cells: string[]): string => cells.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  ');
  const phaseRatios = rows
    .filter((r) => !r.baseline && rows.some((b) => b.baseline && b.group === r.group && r.group !== undefined))
    .map((r) => {
      const b = rows.find((x) => x.baseline && x.group === r.group)!;
      const q = (a: number, z: number): string => `${(a / z).toFixed(2)}×`;
      return `${r.name} / ${b.name}: tools put ${q(r.toolsPutMs, b.toolsPutMs)}, runs put ${q(r.runsPutMs, b.runsPutMs)}, batch ${q(r.toolsBatchMs, b.toolsBatchMs)}, reload ${q(r.reloadMs, b.reloadMs)}`;
    });
  return [line(head), line(widths.map((w) => '-'.repeat(w))), ...body.map(line), '', ...phaseRatios].join('\n');
}

/** The subset of `idb-keyval` the baseline needs (passed in, so this file imports nothing). */
export interface IdbKeyval {
  createStore(dbName: string, storeName: string): unknown;
  get(key: IDBValidKey, store?: never): Promise<unknown>;
  set(key: IDBValidKey, value: unknown, store?: never): Promise<void>;
  setMany(entries: Array<[IDBValidKey, unknown]>, store?: never): Promise<void>;
  del(key: IDBValidKey, store?: never): Promise<void>;
  delMany(keys: IDBValidKey[], store?: never): Promise<void>;
  entries(store?: never): Promise<Array<[IDBValidKey, unknown]>>;
}

/**
 * The baseline: a plain `idb-keyval` custom store wearing the Store interface. No value
 * checks, default durability; `scan` reads every entry and filters (idb-keyval has no ranges).
 * `createStore` opens through `globalThis.indexedDB`.
 */
export function idbKeyvalStore(kv: IdbKeyval, dbName: string): Store {
  const custom = kv.createStore(dbName, 'kv') as never;
  return {
    get: (key) => kv.get(key, custom) as Promise<JsonValue | undefined>,
    put: (key, value) => kv.set(key, value, custom),
    delete: (key) => kv.del(key, custom),
    async scan(prefix) {
      const all = (await kv.entries(custom)) as Array<[string, JsonValue]>;
      return all.filter(([k]) => k.startsWith(prefix)).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    },
    async batch(ops) {
      // idb-keyval has no mixed batch; the bench only puts, so one setMany is one transaction.
      const puts = ops.filter((op) => op.type === 'put') as Array<{ key: string; value: JsonValue }>;
      await kv.setMany(puts.map((op) => [op.key, op.value]), custom);
      const dels = ops.filter((op) => op.type === 'delete').map((op) => op.key);
      if (dels.length > 0) await kv.delMany(dels, custom);
    },
    async close() {
      // idb-keyval keeps its connection for the page's lifetime.
    },
  };
}
