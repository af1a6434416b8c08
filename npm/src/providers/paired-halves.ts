/**
 * The halves of a UTF-16 surrogate pair that a provider split between two chunks, joined again
 * before the core reads them. The core reads each chunk as well-formed text, where a lone half
 * is U+FFFD for good: an emoji split by a provider of one's own that slices text by code units,
 * or by a server that writes each half as its own `\uXXXX` escape in its own event, arrived as
 * two U+FFFD.
 */

import { isRecord } from '../errors.js';

const endsInHighHalf = (text: string) => {
  const last = text.charCodeAt(text.length - 1);
  return last >= 0xd800 && last <= 0xdbff;
};

/**
 * Steps of a provider's stream (`IteratorResult`s of `ModelChunk`s) passed through
 * {@link PairedHalves.join}: a text delta, or a call's arguments delta, that ends in a high
 * half gives it to the next delta of the same kind. A half nothing continues is given back
 * alone before the answer's `finish` (or end), where the core reads it as U+FFFD as before.
 * Anything else, malformed steps included, passes as it came: the core judges those.
 */
export class PairedHalves {
  #text = '';
  /** A call's held half by the chunk's `index`, as the provider gave it. */
  readonly #args = new Map<unknown, string>();
  /** The id each index's call was last given: servers that number every call alike tell
   *  calls apart by their ids, and a half never goes to another call. */
  readonly #ids = new Map<unknown, unknown>();
  /** Steps to give before reading the provider again: held halves, then the step they preceded. */
  readonly #queued: unknown[] = [];

  /** The next step waiting to be given, if any. */
  takeQueued(): unknown {
    return this.#queued.shift();
  }

  /** `step` with a held half put before its delta and a trailing high half held back (typed as
   *  it came: the core reads steps, whatever the provider's types said). */
  join<Step>(step: Step): Step {
    return this.#joined(step) as Step;
  }

  #joined(step: unknown): unknown {
    if (!isRecord(step)) return step;
    const chunk = step.value;
    if (step.done === true || (isRecord(chunk) && chunk.type === 'finish')) return this.#release(step);
    if (step.done !== false || !isRecord(chunk)) return step;
    if (chunk.type === 'text' && typeof chunk.delta === 'string') {
      const delta = this.#text + chunk.delta;
      this.#text = endsInHighHalf(delta) ? delta.slice(-1) : '';
      return { ...step, value: { ...chunk, delta: this.#text ? delta.slice(0, -1) : delta } };
    }
    if (chunk.type === 'tool_call' && typeof chunk.argumentsDelta === 'string') {
      const newId = typeof chunk.id === 'string' && chunk.id !== '' && chunk.id !== this.#ids.get(chunk.index);
      if (newId) this.#ids.set(chunk.index, chunk.id);
      const before = this.#args.get(chunk.index);
      if (before && newId) {
        // Another call at the same index: the half ends the call before it, given alone first.
        this.#args.delete(chunk.index);
        this.#queued.push(this.#joined(step));
        return { done: false, value: { type: 'tool_call', index: chunk.index, argumentsDelta: before } };
      }
      const delta = (before ?? '') + chunk.argumentsDelta;
      const held = endsInHighHalf(delta) ? delta.slice(-1) : '';
      if (held) this.#args.set(chunk.index, held);
      else this.#args.delete(chunk.index);
      return { ...step, value: { ...chunk, argumentsDelta: held ? delta.slice(0, -1) : delta } };
    }
    return step;
  }

  /** The held halves, each as a chunk of its own, then `last` (the finish or the end). */
  #release(last: unknown): unknown {
    if (!this.#text && this.#args.size === 0) return last;
    if (this.#text) this.#queued.push({ done: false, value: { type: 'text', delta: this.#text } });
    for (const [index, half] of this.#args) this.#queued.push({ done: false, value: { type: 'tool_call', index, argumentsDelta: half } });
    this.#queued.push(last);
    this.#text = '';
    this.#args.clear();
    return this.#queued.shift();
  }
}
