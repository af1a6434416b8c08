/**
 * The records the durability writer writes, and the check the test runs over the store after
 * the writer was killed. Values derive from keys, so the checker knows every exact value.
 */

import { isDeepStrictEqual } from 'node:util';
import type { BatchOp, JsonValue, Store } from '../../src/stores/types.js';

export const BATCH_SIZE = 5;

/** Key of single put number `i`. */
export function recordKey(i: number): string {
  return `rec/${String(i).padStart(8, '0')}`;
}

/** Key of op `j` of batch `i`. */
export function batchKey(i: number, j: number): string {
  return `batch/${String(i).padStart(8, '0')}/${j}`;
}

/** A ~1 KB value derived from its key. */
export function valueFor(key: string): JsonValue {
  return { key, v: 1, body: `${key}|`.repeat(40), list: Array.from({ length: 20 }, (_, n) => `${key}#${n}`) };
}

/** Batch `i`: puts BATCH_SIZE keys and deletes the single record written just before it. */
export function batchOps(i: number): BatchOp[] {
  const ops: BatchOp[] = [];
  for (let j = 0; j < BATCH_SIZE; j++) ops.push({ type: 'put', key: batchKey(i, j), value: valueFor(batchKey(i, j)) });
  ops.push({ type: 'delete', key: recordKey(i - 1) });
  return ops;
}

/**
 * Problems found in `store` given the writer's acknowledged lines: an acknowledged put that is
 * missing or differs, an acknowledged batch not fully applied, any batch half applied.
 */
export async function durabilityProblems(store: Store, acked: string[]): Promise<string[]> {
  const problems: string[] = [];
  const ackedBatches = new Set(acked.filter((l) => l.startsWith('B ')).map((l) => Number(l.slice(2))));
  for (const line of acked) {
    if (!line.startsWith('P ')) continue;
    const key = line.slice(2);
    const i = Number(key.slice(4));
    const deletedBy = i + 1;
    if ((deletedBy % 10 === 9) && (await store.get(batchKey(deletedBy, 0))) !== undefined) continue; // its batch ran
    const got = await store.get(key);
    if (!isDeepStrictEqual(got, valueFor(key))) problems.push(`acknowledged put ${key} is ${got === undefined ? 'missing' : 'different'}`);
  }
  // Every batch the store shows any trace of, plus every acknowledged one, must be whole.
  const seen = new Set(ackedBatches);
  for (const [key] of await store.scan('batch/')) seen.add(Number(key.split('/')[1]));
  for (const i of seen) {
    const present: boolean[] = [];
    for (let j = 0; j < BATCH_SIZE; j++) {
      const got = await store.get(batchKey(i, j));
      if (got !== undefined && !isDeepStrictEqual(got, valueFor(batchKey(i, j)))) problems.push(`batch ${i} op ${j} has a wrong value`);
      present.push(got !== undefined);
    }
    const previous = await store.get(recordKey(i - 1));
    const applied = present.every(Boolean) && previous === undefined;
    const notApplied = present.every((p) => !p);
    if (!applied && !notApplied) problems.push(`batch ${i} is half applied: puts ${present.join(',')}, delete ${previous === undefined}`);
    if (ackedBatches.has(i) && !applied) problems.push(`acknowledged batch ${i} is not applied`);
  }
  return problems;
}
