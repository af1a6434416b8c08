/**
 * Seeded random Store op sequences and what a plain sorted map answers to them: the oracle the
 * Store contract tests hold every store to (Node stores directly, IndexedDB in Chromium through
 * the store page's `storeOps`, which takes and answers ops in this same form).
 */
import type { BatchOp, JsonValue, Store } from '../../src/stores/types.js';
import { seeded } from './seeded.js';

/** A record with every kind of JSON value, unicode and escapes: what the Store tests write. */
export const STORE_SAMPLE: JsonValue = {
  name: 'slugify',
  v: 1,
  nested: { list: [1, -2.5, 0, 1e300, true, false, null, 'x'], empty: {}, none: [] },
  text: 'unicode: é 漢字 🧪 \u0000 "quoted" \\ \n',
};

export type StoreOp =
  | { op: 'put'; key: string; value: JsonValue }
  | { op: 'delete'; key: string }
  | { op: 'get'; key: string }
  | { op: 'batch'; ops: BatchOp[] }
  | { op: 'scan'; prefix: string };

/** What an op answered: `{ value }`, or `{}` for `undefined` (JSON has none). */
export type StoreResult = { value?: JsonValue | Array<[string, JsonValue]> };

/** `count` ops from `seed`, the results a sorted map gives them, and its final entries. Keys share
 *  prefixes and reach past ASCII, below U+E000 where every store's key order agrees (see
 *  stores/README.md); ops overwrite, delete missing keys and batch both. */
export function randomStoreOps(seed: number, count: number, sample: JsonValue): { ops: StoreOp[]; results: StoreResult[]; final: Array<[string, JsonValue]> } {
  const rng = seeded(seed);
  const alphabet = ['a', 'b', 'a/', 'ab', '/', 'é', '漢', 'z', '~', ' ', '\u0000'];
  const key = () => Array.from({ length: 1 + rng.below(4) }, () => rng.pick(alphabet)).join('');
  const value = (): JsonValue => rng.pick<JsonValue>([null, 0, -1.5, 'x', '', [1, 'é'], { a: { b: [] } }, true, sample]);
  const model = new Map<string, JsonValue>();
  const write = (op: BatchOp) => (op.type === 'put' ? model.set(op.key, op.value) : model.delete(op.key));
  const scan = (prefix: string): Array<[string, JsonValue]> =>
    [...model.entries()].filter(([k]) => k.startsWith(prefix)).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const ops: StoreOp[] = [];
  const results: StoreResult[] = [];
  for (let i = 0; i < count; i++) {
    let op: StoreOp;
    let result: StoreResult = {};
    switch (rng.below(5)) {
      case 0:
        op = { op: 'put', key: key(), value: value() };
        write({ type: 'put', key: op.key, value: op.value });
        break;
      case 1:
        op = { op: 'delete', key: rng.below(2) ? key() : rng.pick([...model.keys(), 'missing']) };
        write({ type: 'delete', key: op.key });
        break;
      case 2:
        op = { op: 'batch', ops: Array.from({ length: rng.below(5) }, () => (rng.below(3) ? { type: 'put', key: key(), value: value() } : { type: 'delete', key: key() })) };
        op.ops.forEach(write);
        break;
      case 3:
        op = { op: 'get', key: key() };
        if (model.has(op.key)) result = { value: model.get(op.key)! };
        break;
      default:
        op = { op: 'scan', prefix: rng.below(4) ? key().slice(0, rng.below(3)) : '' };
        result = { value: scan(op.prefix) };
    }
    ops.push(op);
    results.push(result);
  }
  return { ops, results, final: scan('') };
}

/** Applies `ops` to `store` (as the store page's `storeOps` does in the browser); their results. */
export async function applyStoreOps(store: Store, ops: StoreOp[]): Promise<StoreResult[]> {
  const results: StoreResult[] = [];
  for (const step of ops) {
    let value: StoreResult['value'] | void;
    if (step.op === 'put') value = await store.put(step.key, step.value);
    else if (step.op === 'get') value = await store.get(step.key);
    else if (step.op === 'delete') value = await store.delete(step.key);
    else if (step.op === 'scan') value = await store.scan(step.prefix);
    else value = await store.batch(step.ops);
    results.push(value === undefined ? {} : { value });
  }
  return results;
}
