/**
 * Store benchmark in Node: memoryStore, indexedDbStore on fake-indexeddb against a plain
 * idb-keyval baseline on the same fake-indexeddb factory, and the LevelDB nodeStore.
 *
 * Run: cd npm && npm run bench:stores   (= node --import tsx ../bench/stores.bench.ts)
 * Env: BENCH_ROUNDS (default 3).
 */

import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { indexedDbStore, memoryStore, nodeStore } from '../npm/src/stores/node-entry.js';
import { formatStoreBench, idbKeyvalStore, runStoreBench, type IdbKeyval } from './stores-core.js';

// Dev dependencies live in npm/node_modules; resolve them from there, not from bench/.
const fromNpm = createRequire(new URL('../npm/package.json', import.meta.url));
const load = async <T>(name: string): Promise<T> => (await import(pathToFileURL(fromNpm.resolve(name)).href)) as T;
const fake = await load<{ IDBFactory: new () => IDBFactory; IDBKeyRange: typeof IDBKeyRange }>('fake-indexeddb');
const kv = await load<IdbKeyval>('idb-keyval');

const factory = new fake.IDBFactory();
(globalThis as { indexedDB?: IDBFactory }).indexedDB = factory; // idb-keyval opens through the global
let dbs = 0;
const dirs: string[] = [];

const rows = await runStoreBench(
  () => [
    { name: 'memoryStore', create: async () => ({ store: memoryStore() }) },
    {
      name: 'idb-keyval (fake-indexeddb)',
      group: 'indexeddb',
      baselineOf: 'indexeddb',
      create: async () => {
        const name = `bench-kv-${dbs++}`;
        return { store: idbKeyvalStore(kv, name), reopen: async () => idbKeyvalStore(kv, name) };
      },
    },
    {
      name: 'indexedDbStore (fake-indexeddb)',
      group: 'indexeddb',
      create: async () => {
        const open = () => indexedDbStore({ name: `bench-store-${dbs}`, indexedDB: factory, IDBKeyRange: fake.IDBKeyRange });
        dbs++;
        const store = open();
        return { store, reopen: async () => open() };
      },
    },
    {
      name: 'nodeStore (LevelDB, fsync)',
      create: async () => {
        const path = mkdtempSync(join(tmpdir(), 'crucible-bench-'));
        dirs.push(path);
        return { store: await nodeStore({ path }), reopen: () => nodeStore({ path }) };
      },
    },
  ],
  { rounds: Number(process.env.BENCH_ROUNDS ?? 3), log: (line) => console.error(line) },
);

for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
console.log(`Node ${process.version}, ${rows.length} stores, median of ${process.env.BENCH_ROUNDS ?? 3} rounds\n`);
console.log(formatStoreBench(rows));
