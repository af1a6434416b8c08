// In-page helpers for test/browser-stores.test.ts: the package's indexedDbStore on Chromium's
// real IndexedDB, driven by name through `callInPage` with JSON arguments and results.
import { indexedDbStore } from 'crucible-agents';

const stores = new Map();
/** One store per (database, object store) in this page, opened lazily by the package. */
const storeOf = (name, storeName) => {
  const id = `${name}\u0000${storeName ?? ''}`;
  if (!stores.has(id)) stores.set(id, indexedDbStore(storeName ? { name, storeName } : { name }));
  return stores.get(id);
};

const describeError = (error) => ({ error: { code: error?.code, name: error?.name, message: String(error?.message ?? error) } });

/**
 * Runs ops in order: `{ op: 'put', key, value }`, `{ op: 'get', key }`, `{ op: 'delete', key }`,
 * `{ op: 'scan', prefix }`, `{ op: 'batch', ops }`, `{ op: 'close' }`. Each result is
 * `{ value }` or `{ error: { code, name, message } }`; `undefined` comes back as `{}`.
 */
window.storeOps = async (name, ops, storeName) => {
  const results = [];
  for (const step of ops) {
    const store = storeOf(name, storeName);
    try {
      let value;
      if (step.op === 'put') value = await store.put(step.key, step.value);
      else if (step.op === 'get') value = await store.get(step.key);
      else if (step.op === 'delete') value = await store.delete(step.key);
      else if (step.op === 'scan') value = await store.scan(step.prefix);
      else if (step.op === 'batch') value = await store.batch(step.ops);
      else if (step.op === 'close') {
        await store.close();
        stores.delete(`${name}\u0000${storeName ?? ''}`);
      } else throw new Error(`unknown op ${step.op}`);
      results.push(value === undefined ? {} : { value });
    } catch (error) {
      results.push(describeError(error));
    }
  }
  return results;
};

/** Puts a value the JSON checks cannot see as wrong but IndexedDB rejects. */
window.putWithBadValue = async (name) => {
  try {
    await storeOf(name).batch([
      { type: 'put', key: 'first', value: 1 },
      { type: 'put', key: 'clone', value: { fn: () => 1 } },
    ]);
    return {};
  } catch (error) {
    return describeError(error);
  }
};

/**
 * Makes `IDBObjectStore.put` fail for `key`: `sync` throws at once (as a DataError would);
 * `async` issues an `add` over an existing key, so the request fails later with a
 * ConstraintError and the transaction must abort on its own.
 */
window.sabotagePut = (key, how, existingKey) => {
  const original = IDBObjectStore.prototype.put;
  IDBObjectStore.prototype.put = function (value, k) {
    if (k !== key) return original.call(this, value, k);
    if (how === 'sync') throw new DOMException(`sabotaged put of ${key}`, 'DataError');
    return this.add(value, existingKey);
  };
  window.restorePut = () => {
    IDBObjectStore.prototype.put = original;
  };
};

/** Starts a large batch and returns without waiting for it (the test then reloads the page). */
window.beginBatch = (name, count) => {
  const ops = Array.from({ length: count }, (_, i) => ({ type: 'put', key: `crash/${String(i).padStart(5, '0')}`, value: { i, pad: 'x'.repeat(200) } }));
  storeOf(name).batch(ops).catch(() => {});
  return ops.length;
};

/**
 * One of two tabs writing at once. Both wait on a BroadcastChannel handshake so their writes
 * overlap, then fire `count` puts (plus a batch every 10) without awaiting each. Returns the
 * wall-clock window of its writes so the test can check the tabs really overlapped.
 */
window.concurrentWriter = async (name, who, count) => {
  const channel = new BroadcastChannel(`start-${name}`);
  await new Promise((go) => {
    let started = false;
    channel.onmessage = (event) => {
      if (event.data === 'ready' && !started) {
        started = true;
        channel.postMessage('ready'); // the other tab may have missed our first message
        go();
      }
    };
    channel.postMessage('ready');
  });
  channel.close();
  const store = storeOf(name);
  const start = performance.timeOrigin + performance.now();
  const writes = [];
  for (let i = 0; i < count; i++) {
    writes.push(store.put(`w/${String(i).padStart(4, '0')}/${who}`, { by: who, i }));
    if (i % 10 === 0) writes.push(store.batch([{ type: 'put', key: `w/batch/${who}/${i}`, value: i }, { type: 'put', key: `w/shared/${i}`, value: who }]));
  }
  await Promise.all(writes);
  return { start, end: performance.timeOrigin + performance.now() };
};

/** Takes the lock `lockName` of a store while the browser refuses Web Locks, as one set to keep
 *  no site data does (`SecurityError`); reports the error, then lets Web Locks work again. */
window.lockWhileLocksRefused = async (name, lockName) => {
  const locks = navigator.locks;
  locks.request = () => Promise.reject(new DOMException('The request was denied.', 'SecurityError'));
  try {
    const release = await storeOf(name).lock(lockName);
    release();
    return {};
  } catch (error) {
    return describeError(error);
  } finally {
    delete locks.request;
  }
};
