/**
 * The browser half of the Chromium store benchmark: bundled by esbuild (see
 * `stores.browser.bench.ts`) into one ES module that puts `runBench` on `window`.
 * Compares `indexedDbStore` with a plain `idb-keyval` baseline on the page's real IndexedDB.
 */

import * as kv from 'idb-keyval';
import { indexedDbStore } from '../npm/src/stores/indexeddb.js';
import { idbKeyvalStore, runStoreBench, type BenchRow, type IdbKeyval } from './stores-core.js';

let dbs = 0;

async function runBench(rounds: number): Promise<BenchRow[]> {
  return runStoreBench(
    () => [
      {
        name: 'idb-keyval (Chromium)',
        group: 'indexeddb',
        baselineOf: 'indexeddb',
        create: async () => {
          const name = `bench-kv-${dbs++}`;
          return { store: idbKeyvalStore(kv as unknown as IdbKeyval, name), reopen: async () => idbKeyvalStore(kv as unknown as IdbKeyval, name) };
        },
      },
      {
        name: 'indexedDbStore (Chromium)',
        group: 'indexeddb',
        create: async () => {
          const name = `bench-store-${dbs++}`;
          return { store: indexedDbStore({ name }), reopen: async () => indexedDbStore({ name }) };
        },
      },
    ],
    { rounds, log: (line) => console.log(line) },
  );
}

(window as unknown as { runBench: typeof runBench }).runBench = runBench;
