/**
 * The in-memory store: the test double and the default when nothing needs to outlive the
 * process or tab. Keys are kept sorted (UTF-16 code unit order, as IndexedDB compares strings);
 * values are stored as JSON text, so callers never share objects with the store.
 */

import { StoreError } from '../errors.js';
import type { BatchOp, JsonValue, Store } from './types.js';
import { checkBatch, checkKey, encodeJson } from './values.js';

/**
 * Creates an empty in-memory {@link Store}. Nothing is persisted; `close` drops the contents.
 * Values are deep-copied on `put` and on `get`/`scan`, so mutating them afterwards does not
 * change what is stored. Every op settles asynchronously, like the persistent stores.
 */
export function memoryStore(): Store {
  let entries: Map<string, string> | null = new Map();
  let keys: string[] = []; // sorted; kept in step with `entries`

  const open = (): Map<string, string> => {
    if (entries === null) throw new StoreError('store_error', 'The memory store is closed');
    return entries;
  };
  /** Index of the first key >= `key`. */
  const lowerBound = (key: string): number => {
    let lo = 0;
    let hi = keys.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (keys[mid]! < key) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  const write = (map: Map<string, string>, key: string, text: string): void => {
    if (!map.has(key)) keys.splice(lowerBound(key), 0, key);
    map.set(key, text);
  };
  const remove = (map: Map<string, string>, key: string): void => {
    if (map.delete(key)) keys.splice(lowerBound(key), 1);
  };

  return {
    async get(key: string): Promise<JsonValue | undefined> {
      checkKey(key);
      const text = open().get(key);
      return text === undefined ? undefined : (JSON.parse(text) as JsonValue);
    },
    async put(key: string, value: JsonValue): Promise<void> {
      checkKey(key);
      const map = open();
      write(map, key, encodeJson(value, key));
    },
    async delete(key: string): Promise<void> {
      checkKey(key);
      remove(open(), key);
    },
    async scan(prefix: string): Promise<Array<[string, JsonValue]>> {
      checkKey(prefix);
      const map = open();
      const out: Array<[string, JsonValue]> = [];
      for (let i = lowerBound(prefix); i < keys.length && keys[i]!.startsWith(prefix); i++) {
        const key = keys[i]!;
        out.push([key, JSON.parse(map.get(key)!) as JsonValue]);
      }
      return out;
    },
    async batch(ops: BatchOp[]): Promise<void> {
      const map = open();
      checkBatch(ops);
      // Encode everything first: a bad value must leave the store untouched.
      const encoded = ops.map((op) => (op.type === 'put' ? JSON.stringify(op.value) : null));
      ops.forEach((op, i) => {
        if (op.type === 'put') write(map, op.key, encoded[i]!);
        else remove(map, op.key);
      });
    },
    async close(): Promise<void> {
      entries = null;
      keys = [];
    },
  };
}
