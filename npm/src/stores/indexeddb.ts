/**
 * The IndexedDB store (DESIGN decision 7): one object store of out-of-line string keys whose
 * values are JSON values kept as structured clones.
 *
 * - Every write (`put`, `delete`, `batch`) is ONE readwrite transaction, requested with
 *   `durability: 'strict'` (ignored by engines without the option) and acknowledged on the
 *   transaction's `complete` event, never on a request's `success`. A batch is all-or-nothing:
 *   a failing op aborts the transaction and nothing of it is written.
 * - Writers never read-modify-write a shared record: each key is its own record, so two tabs or
 *   two agents writing different keys at once lose nothing, and the last writer of one key wins.
 * - Another tab asking for a version upgrade (`versionchange`) makes this store close its
 *   connection at once; the next op reopens lazily. If this store's own upgrade is held up by a
 *   connection that does not close, every op fails with `store_blocked` until the upgrade can
 *   start (the blocker closed); then the next op opens again.
 * - Errors: `QuotaExceededError` becomes `store_quota`, everything else `store_error`.
 *
 * Dependency-free on purpose: the `idb` wrapper would save ~40 lines of promisification but
 * resolves writes on request success unless used carefully (`tx.done`), and the store needs the
 * raw `blocked`/`versionchange`/`abort` events anyway.
 * Spec: https://www.w3.org/TR/IndexedDB/
 */

import { isRecord, messageOf, StoreError } from '../errors.js';
import type { BatchOp, JsonValue, Store } from './types.js';
import { checkBatch, checkJson, checkKey } from './values.js';

declare global {
  // Empty here: they merge with the DOM library's declarations where a program has it, and
  // let a Node-only program (no DOM library) read these types without `skipLibCheck`.
  // eslint-disable-next-line @typescript-eslint/no-empty-interface
  interface IDBFactory {}
  // eslint-disable-next-line @typescript-eslint/no-empty-interface
  interface IDBKeyRange {}
}

/** What {@link indexedDbStore} uses of the `IDBKeyRange` class. */
export interface IDBKeyRangeClass {
  bound(lower: unknown, upper: unknown, lowerOpen?: boolean, upperOpen?: boolean): IDBKeyRange;
  lowerBound(lower: unknown, open?: boolean): IDBKeyRange;
}

/** Options of {@link indexedDbStore}. */
export interface IndexedDbStoreOptions {
  /** Database name; stores with the same name (in any tab) share their records. */
  name: string;
  /** The IndexedDB factory; defaults to `globalThis.indexedDB`. In Node pass `fake-indexeddb`'s. */
  indexedDB?: IDBFactory;
  /**
   * The `IDBKeyRange` class matching `indexedDB`, used by `scan`; defaults to
   * `globalThis.IDBKeyRange`. Pass it with a non-global factory (e.g. `fake-indexeddb`'s).
   */
  IDBKeyRange?: IDBKeyRangeClass;
  /** Object store name inside the database; defaults to `"kv"`. */
  storeName?: string;
}

/**
 * Creates a {@link Store} backed by IndexedDB. The database opens lazily on the first op, so
 * open failures (`store_blocked`, `store_error`) surface there. Throws `store_error` at once
 * without a database `name` or when no IndexedDB factory is available.
 *
 * Its `lock`/`tryLock` use Web Locks, which browsers offer only to secure contexts (https,
 * localhost) and Node does not have. Without them the locks hold only within this JavaScript
 * context (keyed by factory, database and object store, so two store objects on one database
 * take turns), and other tabs, workers or processes are not locked out: shared-tier stats
 * flushed by two of them at once can lose counts, and one of them can open an agent id that is
 * already open in another.
 */
export function indexedDbStore(options: IndexedDbStoreOptions): Store {
  if (!isRecord(options)) {
    throw new StoreError('store_error', "indexedDbStore needs an options object with a database `name`, e.g. indexedDbStore({ name: 'my-app' })");
  }
  if (typeof options.name !== 'string' || options.name === '') {
    throw new StoreError('store_error', "indexedDbStore needs a database `name`: a non-empty string, e.g. indexedDbStore({ name: 'my-app' })");
  }
  if (options.storeName !== undefined && (typeof options.storeName !== 'string' || options.storeName === '')) {
    throw new StoreError('store_error', 'indexedDbStore: `storeName` must be a non-empty string');
  }
  const factory = options.indexedDB ?? (globalThis as { indexedDB?: IDBFactory }).indexedDB;
  const keyRange = options.IDBKeyRange ?? (globalThis as { IDBKeyRange?: IDBKeyRangeClass }).IDBKeyRange;
  const storeName = options.storeName ?? 'kv';
  const name = options.name;
  if (factory === undefined) {
    throw new StoreError('store_error', 'No IndexedDB available here: pass `indexedDB` (in Node, fake-indexeddb)');
  }

  let connection: Promise<IDBDatabase> | null = null;
  let closed = false;
  // Set while an upgrade of ours is blocked. Its open request stays queued (an open cannot be
  // withdrawn), and a new open would queue behind it without ever hearing `blocked` and hang:
  // ops fail fast instead, until the request moves on.
  let blockedUpgrade: Promise<void> | null = null;
  const onBlocked = (movedOn: Promise<void>): void => {
    blockedUpgrade = movedOn;
    void movedOn.then(() => {
      if (blockedUpgrade === movedOn) blockedUpgrade = null;
    });
  };

  const connect = (): Promise<IDBDatabase> => {
    if (closed) return Promise.reject(new StoreError('store_error', `The IndexedDB store "${name}" is closed`));
    if (blockedUpgrade !== null) return Promise.reject(blockedError(name));
    if (connection === null) {
      const opening: Promise<IDBDatabase> = openDatabase(factory, name, storeName, onBlocked).then((db) => {
        const drop = (): void => {
          if (connection === opening) connection = null;
        };
        // Another tab wants to upgrade or delete the database: get out of its way.
        db.onversionchange = () => {
          db.close();
          drop();
        };
        // The browser closed the connection (storage cleared, disk error): reopen next time.
        db.onclose = drop;
        return db;
      });
      opening.catch(() => {
        if (connection === opening) connection = null; // retry the open on the next op
      });
      connection = opening;
    }
    return connection;
  };

  /**
   * Runs `issue` inside one transaction and settles when the transaction does: on `complete`
   * with what `issue`'s returned getter reads, on `abort`/`error` with a StoreError.
   */
  const run = async <T>(mode: IDBTransactionMode, what: string, issue: (os: IDBObjectStore) => () => T): Promise<T> => {
    for (let attempt = 0; ; attempt++) {
      const db = await connect();
      let tx: IDBTransaction;
      try {
        tx = mode === 'readwrite' ? db.transaction(storeName, mode, { durability: 'strict' }) : db.transaction(storeName, mode);
      } catch (err) {
        // The connection closed under us (versionchange between open and use): reopen once.
        if ((err as { name?: string })?.name === 'InvalidStateError' && attempt === 0 && !closed) {
          if (connection !== null && (await connection.catch(() => null)) === db) connection = null;
          continue;
        }
        throw toStoreError(err, what);
      }
      return new Promise<T>((resolve, reject) => {
        let read: (() => T) | undefined;
        tx.oncomplete = () => resolve(read!());
        tx.onabort = () => reject(toStoreError(tx.error, what, 'transaction aborted'));
        // No `onerror` handler: cancelling a request's error event would stop the abort and
        // commit the rest of the batch. The abort that follows reports the error once.
        try {
          read = issue(tx.objectStore(storeName));
        } catch (err) {
          // A synchronous throw (DataError, DataCloneError…) aborts the whole transaction.
          tx.onabort = () => reject(toStoreError(err, what));
          try {
            tx.abort();
          } catch {
            reject(toStoreError(err, what));
          }
        }
      });
    }
  };

  const none = (): undefined => undefined;
  const broadcastName = `crucible-indexeddb:${name}:${storeName}`;
  // Web Locks span every tab and worker of the origin, as the database does.
  const locks = (globalThis as { navigator?: { locks?: LockManager } }).navigator?.locks;
  // Resolves with the lock's release function once it is held, or `undefined` when
  // `ifAvailable` and another holder has it (without `ifAvailable` the lock is always given).
  const acquire = (lockName: string, ifAvailable: boolean): Promise<(() => void) | undefined> =>
    locks
      ? new Promise((held, failed) => {
          locks
            .request(`${broadcastName}:${lockName}`, { ifAvailable }, (granted) => (granted ? new Promise<void>((release) => held(() => release())) : held(undefined)))
            // A browser set to keep no site data refuses Web Locks as it refuses IndexedDB
            // (`SecurityError`): a store error, as the database's refusal is, not a raw one.
            .catch((error: unknown) => failed(new StoreError('store_error', `indexedDbStore('${name}'): the browser refused the Web Lock '${lockName}': ${messageOf(error)}`, { cause: error })));
        })
      : acquireInContext(factory, `${broadcastName}:${lockName}`, ifAvailable);

  return {
    broadcastName,
    lock: (lockName: string) => acquire(lockName, false) as Promise<() => void>,
    tryLock: (lockName: string) => acquire(lockName, true),
    async get(key: string): Promise<JsonValue | undefined> {
      checkKey(key);
      return run('readonly', 'get', (os) => {
        const req = os.get(key);
        return () => req.result as JsonValue | undefined;
      });
    },
    async put(key: string, value: JsonValue): Promise<void> {
      checkKey(key);
      checkJson(value, key);
      return run('readwrite', 'put', (os) => {
        os.put(value, key);
        return none;
      });
    },
    async delete(key: string): Promise<void> {
      checkKey(key);
      return run('readwrite', 'delete', (os) => {
        os.delete(key);
        return none;
      });
    },
    async scan(prefix: string): Promise<Array<[string, JsonValue]>> {
      checkKey(prefix);
      let range: IDBKeyRange | undefined;
      if (prefix !== '') {
        if (keyRange === undefined) {
          throw new StoreError('store_error', 'No IDBKeyRange available here: pass `IDBKeyRange` with `indexedDB`');
        }
        range = prefixRange(keyRange, prefix);
      }
      return run('readonly', 'scan', (os) => {
        // Both requests run in one transaction, so they see the same snapshot, in key order.
        const keys = os.getAllKeys(range);
        const values = os.getAll(range);
        return () => (keys.result as string[]).map((k, i): [string, JsonValue] => [k, values.result[i] as JsonValue]);
      });
    },
    async batch(ops: BatchOp[]): Promise<void> {
      checkBatch(ops);
      if (ops.length === 0) return;
      return run('readwrite', 'batch', (os) => {
        for (const op of ops) {
          if (op.type === 'put') os.put(op.value, op.key);
          else os.delete(op.key);
        }
        return none;
      });
    },
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      const pending = connection;
      connection = null;
      const db = await pending?.catch(() => null);
      db?.close(); // pending transactions still finish; new ones are refused
    },
  };
}

/** Rounds of {@link openDatabase} lost to other connections' upgrades before it gives up. */
const MAX_UPGRADE_ROUNDS = 64;

/**
 * Opens `name` and makes sure `storeName` exists, upgrading the version when it does not.
 * A blocked upgrade rejects with `store_blocked` and hands `onBlocked` a promise that resolves
 * once its still-queued request moves on (the upgrade starts, or the request fails); if the
 * request then succeeds, the late connection is closed again so it never leaks.
 */
async function openDatabase(factory: IDBFactory, name: string, storeName: string, onBlocked: (movedOn: Promise<void>) => void): Promise<IDBDatabase> {
  const attempt = (version?: number): Promise<IDBDatabase> =>
    new Promise((resolve, reject) => {
      let settled = false;
      let movedOn: (() => void) | undefined; // set once `blocked` fired
      let req: IDBOpenDBRequest;
      try {
        req = version === undefined ? factory.open(name) : factory.open(name, version);
      } catch (err) {
        reject(toStoreError(err, 'open'));
        return;
      }
      req.onupgradeneeded = () => {
        movedOn?.();
        const db = req.result;
        if (!db.objectStoreNames.contains(storeName)) db.createObjectStore(storeName);
      };
      req.onblocked = () => {
        if (settled) return;
        settled = true;
        onBlocked(new Promise<void>((resolve) => (movedOn = resolve)));
        reject(blockedError(name));
      };
      req.onsuccess = () => {
        movedOn?.();
        if (settled) {
          req.result.close();
          return;
        }
        settled = true;
        resolve(req.result);
      };
      req.onerror = (event) => {
        event.preventDefault?.();
        movedOn?.();
        if (settled) return;
        settled = true;
        reject(toStoreError(req.error, 'open'));
      };
    });

  // Another tab or store object may upgrade the database between our two opens (to create its
  // own object store): then look again. Each such round is someone else's upgrade done, so of
  // N stores opening at once the last needs N rounds; the bound is only a backstop.
  for (let tries = 0; ; tries++) {
    const db = await attempt();
    if (db.objectStoreNames.contains(storeName)) return db;
    const version = db.version;
    db.close();
    try {
      const upgraded = await attempt(version + 1);
      if (upgraded.objectStoreNames.contains(storeName)) return upgraded;
      upgraded.close();
    } catch (err) {
      // VersionError: someone else upgraded first; look again.
      if (!(err instanceof StoreError && err.code === 'store_error' && tries < MAX_UPGRADE_ROUNDS && isNamed(err.cause, 'VersionError'))) throw err;
    }
    if (tries >= MAX_UPGRADE_ROUNDS) throw new StoreError('store_error', `Could not create object store "${storeName}" in "${name}"`);
  }
}

/**
 * The locks of each IndexedDB factory held in this JavaScript context, for where there are no
 * Web Locks (Node, insecure origins): by lock name (database, object store and lock), the
 * promise that settles when the last holder or waiter in line releases it. Keyed by name rather
 * than by store object, because every store object on one database opens the same records.
 */
const contextLocks = new WeakMap<IDBFactory, Map<string, Promise<void>>>();

/** {@link indexedDbStore}'s `lock`/`tryLock` without Web Locks: first come, first served. */
function acquireInContext(factory: IDBFactory, lockName: string, ifAvailable: boolean): Promise<(() => void) | undefined> {
  const held = contextLocks.get(factory) ?? new Map<string, Promise<void>>();
  contextLocks.set(factory, held);
  const before = held.get(lockName);
  if (before !== undefined && ifAvailable) return Promise.resolve(undefined);
  const turn = before ?? Promise.resolve();
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const last = turn.then(() => released);
  held.set(lockName, last);
  return turn.then(() => () => {
    release();
    if (held.get(lockName) === last) held.delete(lockName); // nobody waits: forget the name
  });
}

/**
 * The key range of every string starting with `prefix`: from `prefix` (inclusive) up to the
 * next string after all of them (exclusive). Exact for every key, unlike `prefix + '\uffff'`
 * as an upper bound, which misses keys continuing with U+FFFF.
 */
function prefixRange(range: IDBKeyRangeClass, prefix: string): IDBKeyRange {
  let stem = prefix;
  while (stem.length > 0 && stem.charCodeAt(stem.length - 1) === 0xffff) stem = stem.slice(0, -1);
  if (stem === '') return range.lowerBound(prefix);
  const upper = stem.slice(0, -1) + String.fromCharCode(stem.charCodeAt(stem.length - 1) + 1);
  return range.bound(prefix, upper, false, true);
}

function blockedError(name: string): StoreError {
  return new StoreError('store_blocked', `Opening IndexedDB "${name}" is blocked: another connection (tab) holds an older version open and does not close`);
}

function isNamed(err: unknown, name: string): boolean {
  return typeof err === 'object' && err !== null && (err as { name?: unknown }).name === name;
}

/** Maps a DOMException (or anything thrown) to a typed StoreError. */
function toStoreError(err: unknown, what: string, fallback = 'failed'): StoreError {
  if (err instanceof StoreError) return err;
  if (err === null || err === undefined) return new StoreError('store_error', `IndexedDB ${what}: ${fallback}`);
  const name = (err as { name?: unknown }).name;
  const message = (err as { message?: unknown }).message;
  const detail = `IndexedDB ${what}: ${String(name ?? 'Error')}: ${String(message ?? err)}`;
  if (name === 'QuotaExceededError') return new StoreError('store_quota', detail, { cause: err });
  return new StoreError('store_error', detail, { cause: err });
}
