/**
 * TEST DOUBLE support — a server's side of an answer that would go on for a long time: writes
 * SSE events one at a time, waiting whenever the socket is full, and stops as soon as the
 * client has gone. What it managed to write tells how early the client gave up.
 */

import type { ServerResponse } from 'node:http';

/**
 * Writes `events` (each one SSE event's text, blank line included) to `res`, then ends it;
 * resolves with how many were written before they ran out or the client closed the connection.
 */
export async function writeEvents(res: ServerResponse, events: Iterable<string>): Promise<number> {
  let closed = false;
  let wake: (() => void) | undefined;
  const onClose = () => {
    closed = true;
    wake?.();
  };
  res.on('close', onClose);
  let written = 0;
  try {
    for (const event of events) {
      if (closed) break;
      written++;
      if (!res.write(event)) {
        await new Promise<void>((resolve) => {
          wake = resolve;
          res.once('drain', resolve);
        });
        res.off('drain', wake!);
        wake = undefined;
      }
    }
    if (!closed) res.end();
  } finally {
    res.off('close', onClose);
  }
  return written;
}

/** `count` events made by `event(n)` for n = 0, 1, …, made as they are written. */
export function* numbered(count: number, event: (n: number) => string): Generator<string> {
  for (let n = 0; n < count; n++) yield event(n);
}
