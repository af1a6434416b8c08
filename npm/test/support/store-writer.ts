/**
 * Child process of the durability test: writes records to a nodeStore in a loop until killed
 * and prints one line per acknowledged write, after the write's promise resolved:
 *   `P <key>` for a put, `B <i>` for batch number i (see `durabilityOps` in durability.ts).
 * `--ack-early` is the deliberately broken writer the test must catch: it acknowledges at once
 * and writes behind, once a second.
 *
 * Run: node --import tsx test/support/store-writer.ts <path> [--ack-early]
 */

import { nodeStore } from '../../src/stores/node-entry.js';
import { batchOps, recordKey, valueFor } from './durability.js';

const [path, mode] = process.argv.slice(2);
if (path === undefined) throw new Error('usage: store-writer.ts <path> [--ack-early]');
const store = await nodeStore({ path });
const ackEarly = mode === '--ack-early';
const behind: Array<() => Promise<void>> = [];
if (ackEarly) {
  setInterval(() => {
    for (const write of behind.splice(0)) void write();
  }, 1000);
}
const ack = (line: string): void => {
  process.stdout.write(`${line}\n`);
};

process.stdout.write('READY\n');
for (let i = 0; ; i++) {
  if (i % 10 === 9) {
    const ops = batchOps(i);
    if (ackEarly) {
      behind.push(() => store.batch(ops));
    } else {
      await store.batch(ops);
    }
    ack(`B ${i}`);
  } else {
    const key = recordKey(i);
    if (ackEarly) {
      behind.push(() => store.put(key, valueFor(key)));
    } else {
      await store.put(key, valueFor(key));
    }
    ack(`P ${key}`);
  }
  if (ackEarly) await new Promise((r) => setTimeout(r, 1)); // pace like a real fsync
}
