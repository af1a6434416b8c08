/**
 * A judge's deadline: the one place every review (a forge's or an import's creation review,
 * each reviewer of a promotion panel, asked for or automatic) is bounded in time. The core
 * asks its judge through this stream and reads a `provider_timeout` failure as no answer,
 * which rejects fail-closed without counting as the judge's refusal of the tool.
 */

import { CrucibleError } from '../errors.js';
import { ClosableStream } from '../providers/closable.js';
import type { ModelProvider, ModelRequest } from '../providers/types.js';

/** A judge's `timeoutMs` when it sets none: the built-in providers' own default. */
export const DEFAULT_JUDGE_TIMEOUT_MS = 120_000;

/** The longest deadline a timer keeps (a larger delay fires at once in every host). */
export const MAX_JUDGE_TIMEOUT_MS = 2 ** 31 - 1;

/**
 * `provider.stream(request)` that fails with `provider_timeout` once `timeoutMs` passed since it
 * started without a complete verdict (the core reads up to the answer's `finish`, then closes
 * the stream). The provider's signal then aborts, so
 * it can stop its work; its `next()` is raced, not awaited, so one that never settles, or
 * ignores the signal, is cut off all the same. `outer` (the forge's, run's or promotion's
 * signal) aborts the provider's signal too, and so does a close before the verdict finished
 * (see {@link ClosableStream}). `option` names the setting in the reason.
 */
export function judgeStream(provider: ModelProvider, request: ModelRequest, outer: AbortSignal | undefined, timeoutMs: number, option: string): AsyncIterator<unknown> {
  const stream = new ClosableStream(provider, request, outer);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => {
      const error = new CrucibleError('provider_timeout', `no complete verdict within ${timeoutMs} ms (${option})`);
      // Rejected before the abort: a provider that rejects from its abort listener must not
      // win the race with an error that does not say why.
      reject(error);
      stream.controller.abort(error);
    }, timeoutMs);
  });
  // Read only when raced: a deadline that passes between two `next()` calls is not unhandled.
  expired.catch(() => {});
  // The timer would keep a Node process alive for the rest of the deadline after the review.
  const settle = () => {
    clearTimeout(timer);
    stream.release();
  };
  return {
    next: () => {
      let step: Promise<IteratorResult<unknown>>;
      try {
        // A hand-written provider's `next` may throw, or return no promise.
        step = Promise.resolve(stream.iterator.next());
      } catch (error) {
        settle();
        return Promise.reject(error);
      }
      return Promise.race([step, expired]).then(
        (result) => {
          if (result.done) settle();
          return stream.read(result);
        },
        (error: unknown) => {
          settle();
          throw error;
        },
      );
    },
    return: (value?: unknown) => {
      settle();
      return stream.close(value);
    },
  };
}
