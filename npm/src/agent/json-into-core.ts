/**
 * Values entering the core's memory as JSON text (a host tool's result, a call's arguments),
 * measured before the core copies them in: wasm memory never shrinks.
 */
import { CrucibleError, describeValue } from '../errors.js';
import { AgentRunError } from './results.js';

/** Longest text (in UTF-16 units) that enters the core's memory from one value: a host tool's
 *  JSON result (whatever `maxResultBytes` says), a call's arguments, a forge request, a run's
 *  input. Wasm memory never shrinks, so a tool returning 500 MB would keep the instance, every
 *  agent of this process or page, that large for good. */
export const MAX_UNITS_INTO_CORE = 16 * 2 ** 20;

/** A value as the JSON text the core reads (`undefined` stays `undefined`), measured here,
 *  before the core copies it in: wasm memory never shrinks. `refuse` makes the error for a
 *  value with no JSON form (`why`) or one past {@link MAX_UNITS_INTO_CORE} (`units`). */
function measuredJson(value: unknown, refuse: (why: string, units?: number) => Error): string | undefined {
  if (value === undefined) return undefined;
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (error) {
    throw refuse(unwritableReason(error));
  }
  if (text === undefined) throw refuse('the value has no JSON form');
  if (text.length > MAX_UNITS_INTO_CORE) throw refuse(`the value is ${text.length} characters of JSON`, text.length);
  return text;
}

/** A tool result as JSON text; a value with no JSON form (a function, a `BigInt`, a cycle)
 *  throws, which makes the call an `execution_failed` result, and text past
 *  {@link MAX_UNITS_INTO_CORE} a `result_too_large` one. */
export function jsonText(value: unknown): string | undefined {
  return measuredJson(value, (why, units) =>
    units === undefined
      ? new Error(`the tool returned a value that is not JSON: ${why}`)
      : new CrucibleError('result_too_large', `the tool returned ${units} characters of JSON; the most a host tool may return is ${MAX_UNITS_INTO_CORE}`),
  );
}

/** The JSON text of `agent.tools.call`'s arguments (`undefined` stays `undefined`, which the
 *  core reads as null); a value with no JSON form, or too long, fails the call as arguments the
 *  tool cannot take (`invalid_arguments`). */
export function argumentsJson(args: unknown): string | undefined {
  return measuredJson(args, (why, units) =>
    new AgentRunError('invalid_arguments', `arguments: ${why}${units === undefined ? '' : `; at most ${MAX_UNITS_INTO_CORE} are read`}`, ''),
  );
}

/** A tool's value from what `core.callTool` gives: the JSON text of a call that finished at
 *  once, or a promise of the value. */
export function valueOf(called: string | Promise<unknown>): unknown {
  return typeof called === 'string' ? JSON.parse(called) : called;
}

/** Why `JSON.stringify` refused a value, in words: for a value nested past its own depth
 *  limit the engine says "Maximum call stack size exceeded", which reads like a crash. */
function unwritableReason(error: unknown): string {
  const message = error instanceof Error ? error.message : describeValue(error);
  return error instanceof RangeError && /call stack/i.test(message) ? 'the value nests too deeply to be written as JSON' : message;
}
