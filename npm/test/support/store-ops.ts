/**
 * Seeded random Store op sequences and what a plain sorted map answers to them: the oracle the
 * Store contract tests hold every store to (Node stores directly, IndexedDB in Chromium through
 * the test page).
 */
import type { BatchOp, JsonValue, Store } from '../../src/stores/types.js';
import { seeded } from './seeded.js';

/** One call of a Store method, as data (it crosses into the test page as JSON). */
export type StoreOp =
  | { method: 'put'; args: [key: string, value: JsonValue] }
  | { method: 'delete'; args: [key: string] }
  | { method: 'batch'; args: [ops: BatchOp[]] }
  | { method: 'get'; args: [key: string] }
  | { method: 'scan'; args: [prefix: string] };

/** What a read answered: `get` as `{ found, value }` (JSON has no `undefined`), `scan` its entries. */
export type StoreRead = { found: boolean; value: JsonValue } | Array<[string, JsonValue]>;

/** `count` ops from `seed`, the reads a sorted map gives them, and its final entries. Keys share
 *  prefixes and reach past ASCII, below U+E000 where every store's key order agrees (see
 *  stores/README.md); ops overwrite, delete missing keys and batch both. */
export function randomStoreOps(seed: number, count: number, sample: JsonValue): { ops: StoreOp[]; reads: StoreRead[]; final: Array<[string, JsonValue]> } {
  const rng = seeded(seed);
  const alphabet = ['a', 'b', 'a/', 'ab', '/', 'é', '漢', 'z', '~', ' ', '\u0000'];
  const key = () => Array.from({ length: 1 + rng.below(4) }, () => rng.pick(alphabet)).join('');
  const value = (): JsonValue => rng.pick<JsonValue>([null, 0, -1.5, 'x', '', [1, 'é'], { a: { b: [] } }, true, sample]);
  const model = new Map<string, JsonValue>();
  const scan = (prefix: string): Array<[string, JsonValue]> =>
    [...model.entries()].filter(([k]) => k.startsWith(prefix)).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const ops: StoreOp[] = [];
  const reads: StoreRead[] = [];
  for (let i = 0; i < count; i++) {
    switch (rng.below(5)) {
      case 0: {
        const [k, v] = [key(), value()];
        model.set(k, v);
        ops.push({ method: 'put', args: [k, v] });
        break;
      }
      case 1: {
        const k = rng.below(2) ? key() : rng.pick([...model.keys(), 'missing']);
        model.delete(k);
        ops.push({ method: 'delete', args: [k] });
        break;
      }
      case 2: {
        const batch: BatchOp[] = Array.from({ length: rng.below(5) }, () => (rng.below(3) ? { type: 'put', key: key(), value: value() } : { type: 'delete', key: key() }));
        for (const op of batch) {
          if (op.type === 'put') model.set(op.key, op.value);
          else model.delete(op.key);
        }
        ops.push({ method: 'batch', args: [batch] });
        break;
      }
      case 3: {
        const k = key();
        ops.push({ method: 'get', args: [k] });
        reads.push({ found: model.has(k), value: model.get(k) ?? null });
        break;
      }
      default: {
        const prefix = rng.below(4) ? key().slice(0, rng.below(3)) : '';
        ops.push({ method: 'scan', args: [prefix] });
        reads.push(scan(prefix));
      }
    }
  }
  return { ops, reads, final: scan('') };
}

/** Applies `ops` to `store`; the reads, in order. (`storeApply` in the test page does the same
 *  in the browser.) */
export async function applyStoreOps(store: Store, ops: StoreOp[]): Promise<StoreRead[]> {
  const reads: StoreRead[] = [];
  for (const { method, args } of ops) {
    const result: unknown = await (store[method] as (...a: unknown[]) => Promise<unknown>).apply(store, args);
    if (method === 'get') reads.push({ found: result !== undefined, value: (result ?? null) as JsonValue });
    if (method === 'scan') reads.push(result as Array<[string, JsonValue]>);
  }
  return reads;
}
