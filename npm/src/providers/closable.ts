/**
 * A provider's stream as the core reads it: with a signal of its own, so that a consumer that
 * stops reading early stops the provider's `fetch` too. Both the agent's model and its judges
 * ask through it.
 */

import type { ModelProvider, ModelRequest } from './types.js';

/**
 * `provider.stream(request)` under a signal that `outer` (a run's, forge's or promotion's
 * signal) aborts, and that `close()` aborts when the answer's `finish` chunk has not gone by:
 * the provider's `return()` alone does not reach a provider with none, nor one busy in a
 * `next()` (an async generator's `return()` waits behind its running `next()`). After the
 * finish its work is done, and its signal is left alone.
 */
export class ClosableStream {
  /** Aborts the provider's signal (a deadline passing, say). */
  readonly controller = new AbortController();
  readonly iterator: AsyncIterator<unknown>;
  readonly #outer: AbortSignal | undefined;
  readonly #onOuterAbort = () => this.controller.abort(this.#outer?.reason);
  /** Whether the answer's `finish` chunk went by (the core reads no further). */
  #finished = false;

  /** Starts the provider's stream; what `provider.stream` throws is thrown. */
  constructor(provider: ModelProvider, request: ModelRequest, outer: AbortSignal | undefined) {
    this.#outer = outer;
    if (outer?.aborted) this.controller.abort(outer.reason);
    else outer?.addEventListener('abort', this.#onOuterAbort, { once: true });
    try {
      this.iterator = provider.stream(request, { signal: this.controller.signal })[Symbol.asyncIterator]();
    } catch (error) {
      this.release();
      throw error;
    }
  }

  /** Notes a step `next()` gave, and returns it: a stream that ended no longer follows `outer`. */
  read<R>(result: R): R {
    const step = result as { done?: unknown; value?: { type?: unknown } } | undefined;
    if (step?.done) this.release();
    else this.#finished ||= step?.value?.type === 'finish';
    return result;
  }

  /** Stops following `outer` (the stream ended or failed): a long run's signal keeps no listener per turn. */
  release(): void {
    this.#outer?.removeEventListener('abort', this.#onOuterAbort);
  }

  /** The consumer's `return()`: aborts the provider's signal unless the answer finished, then closes its iterator. */
  close(value?: unknown): Promise<IteratorResult<unknown>> {
    this.release();
    if (!this.#finished) this.controller.abort();
    return this.iterator.return ? this.iterator.return(value) : Promise.resolve({ done: true as const, value });
  }
}
