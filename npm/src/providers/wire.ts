/**
 * Typed reads of a server's JSON. A response is parsed, not trusted: a field the mapping needs
 * as a string, an array or an index may arrive as anything, and a value read on trust turns
 * into a `TypeError` inside the provider or a chunk of the wrong shape handed to the core.
 * Absent and `null` read as `undefined`; a value of another type is a `provider_protocol` error
 * that quotes the event, since guessing would make up part of an answer. Token counts are
 * informational and read leniently.
 */
import { protocolError, textOf, type HttpContext } from './http.js';
import { describeType, isRecord } from '../errors.js';

export type WireObject = Record<string, unknown>;

/** An object field read leniently (informational parts such as token usage, or an error's
 *  details): anything else reads as absent. */
export function loose(value: unknown): WireObject | undefined {
  return typeof value === 'object' && value !== null ? (value as WireObject) : undefined;
}

/** The largest position the core takes (a u32). */
const MAX_INDEX = 2 ** 32 - 1;

export class WireReader {
  /** `raw`: the event or body being read, quoted by the errors (a function when it has to be
   *  made, so it is made only for an error). */
  constructor(
    private readonly ctx: HttpContext,
    private readonly raw: string | (() => string),
  ) {}

  private wrong(what: string, expected: string, value: unknown): never {
    throw protocolError(this.ctx, `\`${what}\` is ${describeType(value)}, not ${expected}`, undefined, textOf(this.raw));
  }


  string(value: unknown, what: string): string | undefined {
    if (value === undefined || value === null || typeof value === 'string') return value ?? undefined;
    return this.wrong(what, 'a string', value);
  }

  object(value: unknown, what: string): WireObject | undefined {
    if (value === undefined || value === null) return undefined;
    if (isRecord(value)) return value as WireObject;
    return this.wrong(what, 'an object', value);
  }

  /** An entry of an array that must be an object (`null` there is no entry at all). */
  entry(value: unknown, what: string): WireObject {
    return this.object(value, what) ?? this.wrong(what, 'an object', value);
  }

  /** The entries of an array field, none when it is absent. */
  array(value: unknown, what: string): unknown[] {
    if (value === undefined || value === null) return [];
    if (Array.isArray(value)) return value;
    return this.wrong(what, 'an array', value);
  }

  /** A position (a tool call's or a content block's index). The core counts positions in 32
   *  bits: one past that is refused here, where the field can be named. */
  index(value: unknown, what: string): number | undefined {
    if (value === undefined || value === null) return undefined;
    if (typeof value === 'number' && Number.isInteger(value) && value >= 0 && value <= MAX_INDEX) return value;
    return this.wrong(what, `a non-negative integer up to ${MAX_INDEX}`, value);
  }

  boolean(value: unknown, what: string): boolean | undefined {
    if (value === undefined || value === null || typeof value === 'boolean') return value ?? undefined;
    return this.wrong(what, 'a boolean', value);
  }

  /** A token count: anything but a non-negative number reads as unknown; a fraction is rounded
   *  down (counts are whole), and a count past 2^53 - 1 reads as that. */
  count(value: unknown): number | undefined {
    return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? Math.min(Math.floor(value), Number.MAX_SAFE_INTEGER) : undefined;
  }
}

/** `value`'s JSON text, made on the first call (errors quote it; nothing else needs it). */
export function lazyText(value: unknown): () => string {
  let text: string | undefined;
  return () => (text ??= JSON.stringify(value));
}

/**
 * Whether a piece of an answer (a `delta`, a `message`) carries anything: a field besides
 * `role` that is not empty. A reasoning model's thinking does, under whichever name its server
 * gives it (`reasoning_content`, `reasoning`, `thinking`), so it is progress though it yields
 * no text. Pieces that carry nothing (`{}`, `{"role": "assistant", "content": ""}`) are what a
 * server or proxy streams to keep a connection open: were they progress, one doing so for a
 * hung model would hold the answer past `timeoutMs` for as long as it kept them coming.
 */
export function carriesNews(piece: WireObject | undefined): boolean {
  if (!piece) return false;
  return Object.entries(piece).some(([key, value]) => key !== 'role' && !isEmptyValue(value));
}

function isEmptyValue(value: unknown): boolean {
  if (value === null || value === undefined || value === '' || value === false) return true;
  if (Array.isArray(value)) return value.length === 0;
  return typeof value === 'object' && Object.keys(value).length === 0;
}
