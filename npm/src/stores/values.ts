/**
 * Key and value checks shared by every store: a store accepts only string keys and strict JSON
 * values, and checks a whole batch before it writes any of it (so a bad op writes nothing).
 * Internal to the package (the agent checks its id with `hasLoneSurrogate` too); not exported.
 */

import { StoreError } from '../errors.js';
import type { BatchOp, JsonValue } from './types.js';

/** Throws `store_error` unless `key` is a string. */
export function checkKey(key: unknown): asserts key is string {
  if (typeof key !== 'string') {
    throw new StoreError('store_error', `Store keys must be strings, got ${typeof key}`);
  }
  // A lone surrogate has no UTF-8 form: the Node store would write U+FFFD instead, so two
  // different keys would land on one record and scans would return a key never written.
  if (hasLoneSurrogate(key)) {
    throw new StoreError('store_error', `Store keys must be well-formed Unicode; ${JSON.stringify(key)} has a lone surrogate`);
  }
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Whether `text` holds a lone UTF-16 surrogate: text with no UTF-8 form, which the core and
 *  the Node store read as U+FFFD, so two such names would name the same records. */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/** A stored value's JSON text, parsed; text that does not parse is a `store_corrupt` error
 *  naming the key, not a bare `SyntaxError`. */
export function decodeJson(text: string, key: string): JsonValue {
  try {
    return JSON.parse(text) as JsonValue;
  } catch (err) {
    throw new StoreError('store_corrupt', `the record at ${JSON.stringify(key)} is not valid JSON`, { cause: err });
  }
}

/** Deepest nesting a stored value may have; also what turns a cycle into an error quickly. */
export const MAX_JSON_DEPTH = 1000;

/**
 * Throws `store_error` unless `value` is strict JSON: null, booleans, finite numbers, strings,
 * dense arrays and plain objects, nested at most {@link MAX_JSON_DEPTH} deep, without cycles.
 * Rejects what `JSON.stringify` would silently change or drop (undefined, functions, NaN,
 * Infinity, Date, Map, class instances) and what it would throw on (BigInt, cycles), so a value
 * reads back as it was written; `-0` alone is let through and reads back as `0` from the stores
 * that keep JSON text (memory, LevelDB). Symbol-keyed properties are ignored, as by JSON and structured
 * clone. Iterative, so deep input cannot overflow the call stack.
 */
export function checkJson(value: unknown, key: string): asserts value is JsonValue {
  // A fast pass without paths or cycle bookkeeping (a cycle just exceeds the depth limit);
  // only a failing value pays for the second pass that names the problem and its place.
  if (!hasProblem(value)) return;
  throw new StoreError('store_error', `Value for key ${JSON.stringify(key)} is not JSON: ${describeProblem(value)}`);
}

function hasProblem(value: unknown): boolean {
  const stack: unknown[] = [value];
  const depths: number[] = [0];
  while (stack.length > 0) {
    const v = stack.pop();
    const depth = depths.pop()!;
    switch (typeof v) {
      case 'string':
      case 'boolean':
        continue;
      case 'number':
        if (!Number.isFinite(v)) return true;
        continue;
      case 'object':
        break;
      default:
        return true;
    }
    if (v === null) continue;
    if (depth >= MAX_JSON_DEPTH) return true;
    if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) {
        if (!(i in v)) return true;
        stack.push(v[i]);
        depths.push(depth + 1);
      }
      continue;
    }
    const proto = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) return true;
    const keys = Object.keys(v);
    for (let i = 0; i < keys.length; i++) {
      stack.push((v as Record<string, unknown>)[keys[i]!]);
      depths.push(depth + 1);
    }
  }
  return false;
}

const EXIT = Symbol('exit');

/** "<what> at <path>" for the first problem of a value `hasProblem` rejected. */
function describeProblem(value: unknown): string {
  // Depth-first; an EXIT marker under each object's children removes it from `ancestors`.
  const stack: Array<{ v: unknown; path: string; depth: number } | typeof EXIT> = [{ v: value, path: '', depth: 0 }];
  const exits: object[] = [];
  const ancestors = new Set<object>();
  while (stack.length > 0) {
    const item = stack.pop()!;
    if (item === EXIT) {
      ancestors.delete(exits.pop()!);
      continue;
    }
    const { v, path, depth } = item;
    const at = (what: string): string => `${what} at ${path || '(root)'}`;
    switch (typeof v) {
      case 'string':
      case 'boolean':
        continue;
      case 'number':
        if (!Number.isFinite(v)) return at(String(v));
        continue;
      case 'object':
        break;
      default:
        return at(typeof v);
    }
    if (v === null) continue;
    if (ancestors.has(v)) return at('a cycle');
    if (depth >= MAX_JSON_DEPTH) return at(`nesting deeper than ${MAX_JSON_DEPTH}`);
    ancestors.add(v);
    exits.push(v);
    stack.push(EXIT);
    if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) {
        if (!(i in v)) return at(`a hole at index ${i}`);
        stack.push({ v: v[i], path: `${path}[${i}]`, depth: depth + 1 });
      }
      continue;
    }
    const proto = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) return at(`a ${proto?.constructor?.name ?? 'non-plain'} object`);
    for (const k of Object.keys(v)) {
      stack.push({ v: (v as Record<string, unknown>)[k], path: `${path}.${k}`, depth: depth + 1 });
    }
  }
  return 'an unsupported value';
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
