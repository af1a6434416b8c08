/**
 * The Store contract (DESIGN decision 7), run against every store, then what is specific to
 * each: IndexedDB upgrades, blocking and quota; the node store's lock and crash durability.
 */

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { IDBFactory, IDBKeyRange, IDBObjectStore } from 'fake-indexeddb';
import { StoreError } from '../src/errors.js';
import { indexedDbStore, memoryStore, nodeStore } from '../src/stores/node-entry.js';
import type { JsonValue, Store } from '../src/stores/types.js';
import { iterations } from './support/seeded.js';
import { applyStoreOps, randomStoreOps, STORE_SAMPLE } from './support/store-ops.js';
import { durabilityProblems } from './support/durability.js';

const here = dirname(fileURLToPath(import.meta.url));
const tempDirs: string[] = [];
function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'crucible-store-'));
  tempDirs.push(dir);
  return dir;
}
after(() => {
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
});

/** A fresh store, and (for persistent stores) a way to open the same data again. */
interface Subject {
  store: Store;
  /** Opens a new store on the same data; the old one must be closed first. */
  reopen?: () => Promise<Store>;
  /** Opens a second store on the same data while the first is open (two tabs). */
  second?: () => Promise<Store>;
}

const kinds: Array<{ name: string; make: () => Promise<Subject> }> = [
  {
    name: 'memoryStore',
    make: async () => ({ store: memoryStore() }),
  },
  {
    name: 'indexedDbStore (fake-indexeddb)',
    make: async () => {
      const factory = new IDBFactory(); // a fresh, empty "browser profile" per test
      const open = async () => indexedDbStore({ name: 'crucible', indexedDB: factory, IDBKeyRange });
      return { store: await open(), reopen: open, second: open };
    },
  },
  {
    name: 'nodeStore (LevelDB)',
    make: async () => {
      const path = tempDir();
      return { store: await nodeStore({ path }), reopen: () => nodeStore({ path }) };
    },
  },
];

async function rejectsWith(promise: Promise<unknown>, code: StoreError['code']): Promise<StoreError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof StoreError, `expected a StoreError, got ${String(err)}`);
    assert.equal(err.code, code);
    return err;
  }
  assert.fail(`expected a StoreError ${code}, but the op succeeded`);
}

/** `promise`, or a rejection saying it is still pending after `ms` (instead of a hung test). */
function settlesWithin<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`still pending after ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

const sample = STORE_SAMPLE;

for (const kind of kinds) {
  describe(`Store contract: ${kind.name}`, () => {
    it('get of a missing key is undefined', async () => {
      const { store } = await kind.make();
      assert.equal(await store.get('nope'), undefined);
      await store.close();
    });

    it('put then get round-trips a JSON value exactly', async () => {
      const { store } = await kind.make();
      await store.put('tool/slugify', sample);
      await store.put('scalar/null', null);
      await store.put('scalar/str', '');
      await store.put('scalar/num', 42);
      assert.deepEqual(await store.get('tool/slugify'), sample);
      assert.equal(await store.get('scalar/null'), null);
      assert.equal(await store.get('scalar/str'), '');
      assert.equal(await store.get('scalar/num'), 42);
      await store.close();
    });

    it('-0 reads back as JSON writes it (0) from the stores keeping JSON text, as -0 from IndexedDB', async () => {
      const { store } = await kind.make();
      await store.put('n', -0);
      assert.ok(Object.is(await store.get('n'), kind.name.startsWith('indexedDbStore') ? -0 : 0));
      await store.close();
    });

    it('put overwrites and delete removes (deleting a missing key is fine)', async () => {
      const { store } = await kind.make();
      await store.put('k', 1);
      await store.put('k', { now: 2 });
      assert.deepEqual(await store.get('k'), { now: 2 });
      await store.delete('k');
      await store.delete('never-written');
      assert.equal(await store.get('k'), undefined);
      await store.close();
    });

    it('stored values are copies: mutating what was put or got changes nothing', async () => {
      const { store } = await kind.make();
      const value = { list: [1, 2], inner: { a: 1 } };
      await store.put('k', value);
      value.list.push(3);
      value.inner.a = 99;
      const got = (await store.get('k')) as { list: number[]; inner: { a: number } };
      got.list.push(4);
      assert.deepEqual(await store.get('k'), { list: [1, 2], inner: { a: 1 } });
      await store.close();
    });

    it('scan returns entries in key order whatever the insertion order', async () => {
      const { store } = await kind.make();
      for (const k of ['run/c', 'run/a', 'run/b2', 'run/b10', 'run/b']) await store.put(k, k);
      assert.deepEqual(
        (await store.scan('run/')).map(([k]) => k),
        ['run/a', 'run/b', 'run/b10', 'run/b2', 'run/c'],
      );
      await store.close();
    });

    it('scan isolates prefixes that share leading characters', async () => {
      const { store } = await kind.make();
      const keys = ['too', 'tool', 'tool/a', 'tool/ab', 'tool0', 'tools/x', 'toom', 'u', 'a'];
      await store.batch(keys.map((key) => ({ type: 'put' as const, key, value: { key } })));
      assert.deepEqual(await store.scan('tool/'), [
        ['tool/a', { key: 'tool/a' }],
        ['tool/ab', { key: 'tool/ab' }],
      ]);
      assert.deepEqual(
        (await store.scan('tool')).map(([k]) => k),
        ['tool', 'tool/a', 'tool/ab', 'tool0', 'tools/x'],
      );
      assert.deepEqual(
        (await store.scan('tools')).map(([k]) => k),
        ['tools/x'],
      );
      assert.deepEqual(await store.scan('tool/abc'), []);
      assert.deepEqual((await store.scan('')).map(([k]) => k), [...keys].sort());
      await store.close();
    });

    it('scan finds keys that continue with U+FFFF and non-ASCII characters', async () => {
      const { store } = await kind.make();
      for (const k of ['p\uffff', 'p\uffff\uffffz', 'p\uffffa', 'pé', 'q']) await store.put(k, k);
      assert.deepEqual(
        (await store.scan('p\uffff')).map(([k]) => k),
        ['p\uffff', 'p\uffff\uffffz', 'p\uffffa'].sort(),
      );
      assert.deepEqual((await store.scan('pé')).map(([k]) => k), ['pé']);
      await store.close();
    });

    it('a key with a lone surrogate is refused (it has no UTF-8 form), and writes nothing', async () => {
      const { store } = await kind.make();
      for (const key of ['k\uD800', 'k\uDC00', '\uDBFFx']) {
        await rejectsWith(store.put(key, 1), 'store_error');
        await rejectsWith(store.batch([{ type: 'put', key: 'fine', value: 1 }, { type: 'put', key, value: 2 }]), 'store_error');
      }
      await store.put('k\uD83D\uDE00', 'a pair is fine');
      assert.deepEqual(await store.scan(''), [['k\uD83D\uDE00', 'a pair is fine']]);
      await store.close();
    });

    it('batch applies its puts and deletes in order', async () => {
      const { store } = await kind.make();
      await store.put('old', 1);
      await store.batch([
        { type: 'put', key: 'a', value: 1 },
        { type: 'delete', key: 'a' },
        { type: 'delete', key: 'b' },
        { type: 'put', key: 'b', value: 2 },
        { type: 'delete', key: 'old' },
      ]);
      assert.deepEqual(await store.scan(''), [['b', 2]]);
      await store.batch([]);
      await store.close();
    });

    for (const [what, bad] of [
      ['a function', () => 1],
      ['a BigInt', 10n],
      ['NaN', Number.NaN],
      ['undefined', undefined],
      ['a Date', new Date(0)],
      ['a Map', new Map([['a', 1]])],
      ['an array hole', [1, , 3]],
      ['nesting deeper than 1000', Array.from({ length: 1001 }).reduce((inner: unknown) => [inner], 0)],
      ['a cycle', (() => {
        const o: Record<string, unknown> = {};
        o.self = o;
        return o;
      })()],
    ] as Array<[string, unknown]>) {
      it(`a batch containing ${what} writes nothing and rejects with store_error`, async () => {
        const { store } = await kind.make();
        await store.put('existing', 'before');
        await rejectsWith(
          store.batch([
            { type: 'put', key: 'first', value: 1 },
            { type: 'delete', key: 'existing' },
            { type: 'put', key: 'bad', value: { deep: [bad] } as unknown as JsonValue },
          ]),
          'store_error',
        );
        assert.deepEqual(await store.scan(''), [['existing', 'before']]);
        await rejectsWith(store.put('bad', bad as JsonValue), 'store_error');
        assert.equal(await store.get('bad'), undefined);
        await store.close();
      });
    }

    it('two writers interleaving many keys at once lose nothing', async () => {
      const subject = await kind.make();
      // Two tabs where the store supports it; otherwise two agents sharing one store.
      const a = subject.store;
      const b = subject.second ? await subject.second() : subject.store;
      const writes: Array<Promise<void>> = [];
      for (let i = 0; i < 100; i++) {
        writes.push(a.put(`w/${String(i).padStart(3, '0')}/a`, { by: 'a', i }));
        writes.push(b.put(`w/${String(i).padStart(3, '0')}/b`, { by: 'b', i }));
        if (i % 10 === 0) writes.push(b.batch([{ type: 'put', key: `w/batch/${i}`, value: i }]));
      }
      await Promise.all(writes);
      for (const reader of [a, b]) {
        const all = await reader.scan('w/');
        assert.equal(all.length, 210);
        assert.deepEqual(all.find(([k]) => k === 'w/057/b')?.[1], { by: 'b', i: 57 });
      }
      await a.close();
      if (b !== a) await b.close();
    });

    it('random op sequences read back what a plain sorted map would, also after a reopen', async () => {
      const { ops, results, final } = randomStoreOps(0x5707e5 + kind.name.length, iterations(300), sample);
      assert.ok(final.length > 10, 'the sequence leaves records to read back');
      const subject = await kind.make();
      assert.deepEqual(await applyStoreOps(subject.store, ops), results);
      assert.deepEqual(await subject.store.scan(''), final);
      await subject.store.close();
      if (subject.reopen) {
        const again = await subject.reopen();
        assert.deepEqual(await again.scan(''), final, 'the same records after a reopen');
        await again.close();
      }
    });

    it('ops after close reject with store_error', async () => {
      const { store } = await kind.make();
      await store.put('k', 1);
      await store.close();
      await rejectsWith(store.get('k'), 'store_error');
      await rejectsWith(store.put('k', 2), 'store_error');
    });

    if (kind.name !== 'memoryStore') {
      it('close then reopen finds every write, in order', async () => {
        const subject = await kind.make();
        await subject.store.put('tool/b', sample);
        await subject.store.batch([
          { type: 'put', key: 'tool/a', value: [1, 2, 3] },
          { type: 'put', key: 'run/1', value: { state: 'paused' } },
        ]);
        await subject.store.delete('run/1');
        await subject.store.close();
        const again = await subject.reopen!();
        assert.deepEqual(await again.scan(''), [
          ['tool/a', [1, 2, 3]],
          ['tool/b', sample],
        ]);
        await again.close();
      });
    }
  });
}

describe('indexedDbStore specifics', () => {
  it('closes its connection when another tab upgrades, then reopens on the next op', async () => {
    const factory = new IDBFactory();
    const store = indexedDbStore({ name: 'tabs', indexedDB: factory, IDBKeyRange });
    await store.put('k', 'v');
    const other = await new Promise<IDBDatabase>((resolve, reject) => {
      const req = factory.open('tabs', 5);
      req.onupgradeneeded = () => req.result.createObjectStore('other');
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
      req.onblocked = () => reject(new Error('blocked by the store'));
    });
    assert.equal(other.version, 5);
    other.close();
    assert.equal(await store.get('k'), 'v');
    await store.put('k2', 'v2');
    assert.deepEqual((await store.scan('')).length, 2);
    await store.close();
  });

  it('while its upgrade is blocked every op fails at once with store_blocked; once the blocker closes ops work', async () => {
    const factory = new IDBFactory();
    // A tab that holds version 1 open and ignores versionchange.
    const stubborn = await new Promise<IDBDatabase>((resolve, reject) => {
      const req = factory.open('blocked', 1);
      req.onupgradeneeded = () => req.result.createObjectStore('kv');
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
    // A store needing a new object store must upgrade the database.
    const store = indexedDbStore({ name: 'blocked', indexedDB: factory, IDBKeyRange, storeName: 'tools' });
    // Not only the op that met the blocked upgrade: later ones (an agent's registry load is a
    // scan) must not queue behind it until the blocker closes.
    const ops: Array<() => Promise<unknown>> = [() => store.put('k', 1), () => store.get('k'), () => store.scan(''), () => store.batch([{ type: 'delete', key: 'k' }])];
    try {
      for (const op of ops) await rejectsWith(settlesWithin(op(), 500), 'store_blocked');
    } finally {
      stubborn.close(); // fake-indexeddb polls until it closes, which would keep the test process alive
    }
    await new Promise((r) => setTimeout(r, 20)); // the engine lets the queued upgrade start
    await store.put('k', 1);
    assert.equal(await store.get('k'), 1);
    await store.close();
  });

  it('many object stores of one database opened at once each get theirs (one upgrade after another)', async () => {
    // Agents with their own `storeName` in one database, created together at page load: each
    // store's first op upgrades the database, and the others' upgrades keep moving its version.
    const factory = new IDBFactory();
    const stores = Array.from({ length: 12 }, (_, i) => indexedDbStore({ name: 'app', storeName: `agent${i}`, indexedDB: factory, IDBKeyRange }));
    await settlesWithin(Promise.all(stores.map((store, i) => store.put('k', i))), 5000);
    assert.deepEqual(await Promise.all(stores.map((store) => store.get('k'))), stores.map((_, i) => i));
    await Promise.all(stores.map((store) => store.close()));
  });

  it('without Web Locks, store objects on one database share their locks in this context', async () => {
    assert.equal((globalThis as { navigator?: { locks?: unknown } }).navigator?.locks, undefined, 'Node has no Web Locks');
    const factory = new IDBFactory();
    const open = (name = 'app', storeName?: string, indexedDB = factory) => indexedDbStore({ name, storeName, indexedDB, IDBKeyRange });
    const [a, b] = [open(), open()];
    const release = await a.tryLock!('agent:bot');
    assert.ok(release);
    assert.equal(await b.tryLock!('agent:bot'), undefined, 'the same database and object store: taken');
    for (const other of [open('other'), open('app', 'other'), open('app', undefined, new IDBFactory())]) {
      const free = await other.tryLock!('agent:bot');
      assert.ok(free, 'another database, object store or factory holds other records');
      free();
    }
    const order: string[] = [];
    const waiting = b.lock!('agent:bot').then((releaseB) => {
      order.push('b holds it');
      releaseB();
    });
    await new Promise((r) => setTimeout(r, 10));
    order.push('a releases');
    release();
    await waiting;
    assert.deepEqual(order, ['a releases', 'b holds it']);
    const again = await b.tryLock!('agent:bot');
    assert.ok(again, 'released by its holders: free again');
    again();
  });

  it('a QuotaExceededError aborts the batch and rejects with store_quota', async () => {
    const factory = new IDBFactory();
    const store = indexedDbStore({ name: 'quota', indexedDB: factory, IDBKeyRange });
    await store.put('kept', 1);
    // Simulate the browser refusing the write the way it does: the transaction aborts with a
    // QuotaExceededError. `_abort` is fake-indexeddb's internal hook for this.
    const put = IDBObjectStore.prototype.put;
    IDBObjectStore.prototype.put = function (this: IDBObjectStore, ...args: Parameters<typeof put>) {
      const req = put.apply(this, args);
      if (args[1] === 'too-big') (this.transaction as unknown as { _abort(name: string): void })._abort('QuotaExceededError');
      return req;
    } as typeof put;
    try {
      await rejectsWith(
        store.batch([
          { type: 'put', key: 'a', value: 1 },
          { type: 'put', key: 'too-big', value: 2 },
        ]),
        'store_quota',
      );
    } finally {
      IDBObjectStore.prototype.put = put;
    }
    assert.deepEqual(await store.scan(''), [['kept', 1]]);
    await store.close();
  });

  it('throws store_error when no IndexedDB is available', () => {
    assert.throws(() => indexedDbStore({ name: 'x' }), (err) => err instanceof StoreError && err.code === 'store_error');
  });

  it('throws store_error, not a TypeError, without options or without a database name', () => {
    const factory = new IDBFactory();
    const refused = (make: () => unknown, pattern: RegExp) =>
      assert.throws(make, (err: unknown) => {
        assert.ok(err instanceof StoreError, `expected a StoreError, got ${String(err)}`);
        assert.equal(err.code, 'store_error');
        assert.match(err.message, pattern);
        return true;
      });
    refused(() => (indexedDbStore as (o?: unknown) => unknown)(), /indexedDbStore needs an options object with a database `name`/);
    refused(() => indexedDbStore(null as never), /indexedDbStore needs an options object/);
    refused(() => indexedDbStore('crucible' as never), /indexedDbStore needs an options object/);
    refused(() => indexedDbStore({ indexedDB: factory, IDBKeyRange } as never), /indexedDbStore needs a database `name`/);
    refused(() => indexedDbStore({ name: '', indexedDB: factory, IDBKeyRange }), /database `name`: a non-empty string/);
    refused(() => indexedDbStore({ name: 42 as never, indexedDB: factory, IDBKeyRange }), /database `name`/);
    refused(() => indexedDbStore({ name: 'x', indexedDB: factory, IDBKeyRange, storeName: 7 as never }), /`storeName` must be a non-empty string/);
  });
});

describe('nodeStore specifics', () => {
  it('rejects with store_error, not a TypeError, without options or without a path', async () => {
    for (const options of [undefined, null, './.crucible']) {
      const err = await rejectsWith((nodeStore as (o?: unknown) => Promise<Store>)(options), 'store_error');
      assert.match(err.message, /nodeStore needs an options object with a directory `path`/);
    }
    for (const options of [{}, { path: '' }, { path: 42 }, { dir: tempDir() }]) {
      const err = await rejectsWith(nodeStore(options as never), 'store_error');
      assert.match(err.message, /nodeStore needs a directory `path`: a non-empty string/);
    }
  });

  it('a record whose text is not JSON is store_corrupt naming its key, on get and on scan', async () => {
    const path = tempDir();
    const { ClassicLevel } = await import('classic-level');
    const raw = new ClassicLevel<string, string>(path, { keyEncoding: 'utf8', valueEncoding: 'utf8' });
    await raw.put('agent/a/tool/x', '{"kind":"tool","v":1,"data":');
    await raw.close();
    const store = await nodeStore({ path });
    const err = await rejectsWith(store.get('agent/a/tool/x'), 'store_corrupt');
    assert.match(err.message, /agent\/a\/tool\/x/);
    await rejectsWith(store.scan('agent/a/'), 'store_corrupt');
    await store.close();
  });

  it('one store owns a path: a second open fails with store_blocked until the first closes', async () => {
    const path = tempDir();
    const first = await nodeStore({ path });
    const err = await rejectsWith(nodeStore({ path }), 'store_blocked');
    assert.match(err.message, /another store/);
    await first.close();
    const second = await nodeStore({ path });
    await second.close();
  });

  it('a second process cannot open a path this process owns', async () => {
    const path = tempDir();
    const first = await nodeStore({ path });
    const child = await runNode([
      '--import',
      'tsx',
      '-e',
      `import('./src/stores/node-entry.ts').then(m => m.nodeStore({ path: ${JSON.stringify(path)} })).then(() => console.log('opened'), e => console.log(e.code))`,
    ]);
    assert.equal(child.trim(), 'store_blocked');
    await first.close();
  });

  /** Runs the writer, SIGKILLs it ~300 ms into its writes, returns its acknowledged lines. */
  async function killWriterMidway(path: string, mode: string[]): Promise<string[]> {
    const child = spawn(process.execPath, ['--import', 'tsx', join(here, 'support/store-writer.ts'), path, ...mode], {
      cwd: join(here, '..'),
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.setEncoding('utf8');
    const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on('exit', (_code, signal) => resolve(signal)));
    const closed = new Promise<void>((resolve) => child.stdout.on('end', resolve));
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (chunk: string) => {
        out += chunk;
        if (out.startsWith('READY\n')) resolve();
      });
      child.on('exit', () => reject(new Error(`writer exited early: ${out}`)));
    });
    // Kill once enough writes (a batch among them) are acknowledged, not after a fixed time:
    // a busy machine may fsync slowly, and the checks below need acknowledged writes to check.
    await new Promise<void>((resolve, reject) => {
      const enough = () => {
        const acked = out.split('\n').slice(1, -1);
        return acked.length >= 20 && acked.some((l) => l.startsWith('B '));
      };
      if (enough()) return resolve();
      const timer = setTimeout(() => reject(new Error(`the writer acknowledged too little in 30 s: ${out.length} bytes`)), 30_000);
      child.stdout.on('data', () => {
        if (enough()) {
          clearTimeout(timer);
          resolve();
        }
      });
    });
    child.kill('SIGKILL');
    assert.equal(await exited, 'SIGKILL');
    await closed; // every line written before the kill is in the pipe: read them all
    const lines = out.split('\n');
    lines.pop(); // an unterminated last line was never fully acknowledged
    return lines.filter((l) => l !== 'READY');
  }

  it('SIGKILL during writes loses no acknowledged write and leaves no half batch', async () => {
    const path = tempDir();
    const acked = await killWriterMidway(path, []);
    assert.ok(acked.length >= 20, `the writer acknowledged only ${acked.length} writes`);
    assert.ok(acked.some((l) => l.startsWith('B ')), 'no batch was acknowledged');
    const store = await nodeStore({ path });
    assert.deepEqual(await durabilityProblems(store, acked), []);
    await store.close();
  });

  it('the durability check catches a writer that acknowledges before writing', async () => {
    const path = tempDir();
    const acked = await killWriterMidway(path, ['--ack-early']);
    assert.ok(acked.length >= 20);
    const store = await nodeStore({ path });
    const problems = await durabilityProblems(store, acked);
    assert.ok(problems.length > 0, 'a write-behind writer must be caught losing acknowledged writes');
    await store.close();
  });
});

async function runNode(args: string[]): Promise<string> {
  const child = spawn(process.execPath, args, { cwd: join(here, '..'), stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (c: string) => (out += c));
  await new Promise((resolve) => child.on('close', resolve));
  return out;
}
