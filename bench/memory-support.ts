/**
 * What the memory benches (`agent-startup`, `sandbox-idle`) share: a model and a judge that
 * answer at once (test doubles: no LLM is involved), and resident memory read after the
 * garbage collector settled (run with `node --expose-gc`).
 */

import type { ModelProvider } from '../npm/src/node.js';
import { verdictReply } from '../npm/test/support/forge-fixtures.js';

/** A model double: every request gets one text reply. */
const answering = (text: string): ModelProvider => ({
  id: 'double',
  async *stream() {
    yield { type: 'text', delta: text };
    yield { type: 'finish', finishReason: 'stop' };
  },
});

/** The agents' model double, answering "ok". */
export const model = answering('ok');
/** A judge whose double approves every tool. */
export const judge = { model: answering(String(verdictReply(true).text)) };

const gc = (globalThis as { gc?: () => void }).gc;

/** Collects garbage three times, 200 ms apart, so RSS reflects what is still held. */
export async function settle(): Promise<void> {
  for (let i = 0; i < 3; i++) {
    gc?.();
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The process's resident memory, MB. */
export const rssMB = (): number => process.memoryUsage().rss / 1e6;
