/** Joining abort signals, for the package's own use. */

/**
 * A signal that aborts when `a` or `b` does, with the first one's reason, and `unlink`, which
 * takes its listeners off both once it is no longer needed (a long-lived source, the caller's
 * or an agent's, would otherwise gather one per operation). `AbortSignal.any` holds its sources
 * weakly and needs no unlinking; it is missing from browsers before 2024 (Safari < 17.4), which
 * are linked by hand.
 */
export function linkSignals(a: AbortSignal, b: AbortSignal): { signal: AbortSignal; unlink: () => void } {
  if (typeof AbortSignal.any === 'function') return { signal: AbortSignal.any([a, b]), unlink: () => {} };
  const controller = new AbortController();
  const abort = (event: Event) => controller.abort((event.target as AbortSignal).reason);
  const sources = [a, b];
  for (const source of sources) {
    if (source.aborted) {
      controller.abort(source.reason);
      break;
    }
    source.addEventListener('abort', abort, { once: true });
  }
  return { signal: controller.signal, unlink: () => sources.forEach((source) => source.removeEventListener('abort', abort)) };
}

/**
 * Lifts the platform's bound on listeners for a signal of the package's own that many
 * operations wait on at once (an agent's close signal: every direct forge and call in flight
 * listens to it). Node warns of a likely leak past 10 listeners on one signal; these are no
 * leak, each is removed when its operation ends. The Node entry sets it; browsers warn of none.
 */
let allowManyListeners: (signal: AbortSignal) => void = () => {};

/** Sets how {@link sharedController} lifts the bound (the Node entry: `events.setMaxListeners`). */
export function registerListenerBound(lift: (signal: AbortSignal) => void): void {
  allowManyListeners = lift;
}

/** An `AbortController` whose signal any number of operations may listen to at once. */
export function sharedController(): AbortController {
  const controller = new AbortController();
  allowManyListeners(controller.signal);
  return controller;
}
