/**
 * Key and value checks shared by every store: a store accepts only string keys and strict JSON
 * values, and checks a whole batch before it writes any of it (so a bad op writes nothing).
 * Internal to `stores/`; not exported from the package.
 */

import { StoreError } from '../errors.js';
import type { BatchOp, JsonValue } from './types.js';

/** Throws `store_error` unless `key` is a string. */
export function checkKey(key: unknown): asserts key is string {
  if (typeof key !== 'string') {
    throw new StoreError('store_error', `Store keys must be strings, got ${typeof key}`);
  }
}

/**
 * Throws `store_error` unless `value` is strict JSON: null, booleans, finite numbers, strings,
 * dense arrays and plain objects, without cycles. Rejects what `JSON.stringify` would silently
 * change or drop (undefined, functions, symbols, NaN, Infinity, Date, Map, class instances) and
 * what it would throw on (BigInt, cycles), so a value always reads back as it was written.
 * Iterative, so deeply nested input cannot overflow the call stack.
 */
export function checkJson(value: unknown, key: string): asserts value is JsonValue {
  // Depth-first walk; `exit` entries pop the ancestor set used to detect cycles.
  const stack: Array<{ value: unknown; path: string } | { exit: object }> = [{ value, path: '' }];
  const ancestors = new Set<object>();
  while (stack.length > 0) {
    const item = stack.pop()!;
    if ('exit' in item) {
      ancestors.delete(item.exit);
      continue;
    }
    const { value: v, path } = item;
    const fail = (what: string): never => {
      throw new StoreError('store_error', `Value for key ${JSON.stringify(key)} is not JSON: ${what} at ${path || '(root)'}`);
    };
    switch (typeof v) {
      case 'string':
      case 'boolean':
        continue;
      case 'number':
        if (!Number.isFinite(v)) fail(String(v));
        continue;
      case 'object':
        break;
      default:
        fail(typeof v);
    }
    if (v === null) continue;
    const obj = v as object;
    if (ancestors.has(obj)) fail('a cycle');
    ancestors.add(obj);
    stack.push({ exit: obj });
    if (Array.isArray(obj)) {
      for (let i = obj.length - 1; i >= 0; i--) {
        if (!(i in obj)) fail(`a hole at index ${i}`);
        stack.push({ value: obj[i], path: `${path}[${i}]` });
      }
      continue;
    }
    const proto = Object.getPrototypeOf(obj);
    if (proto !== Object.prototype && proto !== null) fail(`a ${proto?.constructor?.name ?? 'non-plain'} object`);
    if (Object.getOwnPropertySymbols(obj).length > 0) fail('a symbol-keyed property');
    for (const k of Object.keys(obj)) {
      stack.push({ value: (obj as Record<string, unknown>)[k], path: `${path}.${k}` });
    }
  }
}

/** Checks every op of a batch (keys, op types, values) before any of it is written. */
export function checkBatch(ops: unknown): asserts ops is BatchOp[] {
  if (!Array.isArray(ops)) throw new StoreError('store_error', 'A batch must be an array of ops');
  for (const op of ops as unknown[]) {
    const o = op as Partial<BatchOp> | null;
    if (o === null || typeof o !== 'object') throw new StoreError('store_error', 'A batch op must be an object');
    checkKey(o.key);
    if (o.type === 'put') checkJson((o as { value: unknown }).value, o.key);
    else if (o.type !== 'delete') throw new StoreError('store_error', `Unknown batch op type ${JSON.stringify(o.type)}`);
  }
}

/** Checks then serializes a value; the stored form of the memory and node stores. */
export function encodeJson(value: unknown, key: string): string {
  checkJson(value, key);
  return JSON.stringify(value);
}
