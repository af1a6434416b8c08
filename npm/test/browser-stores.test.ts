// indexedDbStore on Chromium's real IndexedDB (the Node tests use fake-indexeddb): the Store
// contract, batch atomicity when IndexedDB itself fails a request, persistence across a page
// reload, two tabs writing at once, a versionchange from another tab — and the store
// benchmark against idb-keyval, run once in the page and printed.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { Browser, BrowserContext } from 'playwright-core';
import { formatStoreBench } from '../../bench/stores-core.js';
import { iterations } from './support/seeded.js';
import { randomStoreOps, STORE_SAMPLE } from './support/store-ops.js';
import { runBrowserStoreBench } from '../../bench/stores.browser.bench.js';
import {
  callInPage,
  describeInBrowser,
  importMapSite,
  launchChromium,
  openPage,
  watchPage,
  type StaticServer,
  type WatchedPage,
} from './browser/harness.js';

type Result = { value?: unknown; error?: { code?: string; name?: string; message: string } };
type Op =
  | { op: 'put'; key: string; value: unknown }
  | { op: 'get' | 'delete'; key: string }
  | { op: 'scan'; prefix: string }
  | { op: 'batch'; ops: unknown[] }
  | { op: 'close' };

const sample = STORE_SAMPLE;

describeInBrowser('indexedDbStore on real IndexedDB in Chromium', () => {
  let browser: Browser;
  let context: BrowserContext;
  let site: StaticServer;
  let tab: WatchedPage;
  let dbCount = 0;
  const freshDb = (): string => `crucible-test-${dbCount++}`;
  const ops = (name: string, list: Op[], storeName?: string, page = tab): Promise<Result[]> =>
    callInPage<Result[]>(page.page, 'storeOps', name, list, storeName);
  const values = (results: Result[]): unknown[] =>
    results.map((r) => {
      assert.equal(r.error, undefined, JSON.stringify(r.error));
      return r.value;
    });

  before(async () => {
    site = await importMapSite('store-page.js', 'crucible-agents stores');
    browser = await launchChromium();
    context = await browser.newContext();
    tab = await openPage(context, `${site.url}/`);
  });

  after(async () => {
    await browser?.close();
    await site?.close();
  });

  test('the contract: put/get round-trip, overwrite, delete, scan order and prefixes', async () => {
    const db = freshDb();
    const got = values(
      await ops(db, [
        { op: 'get', key: 'nope' },
        { op: 'put', key: 'tool/slugify', value: sample },
        { op: 'put', key: 'scalar/null', value: null },
        { op: 'put', key: 'scalar/str', value: '' },
        { op: 'get', key: 'tool/slugify' },
        { op: 'get', key: 'scalar/null' },
        { op: 'get', key: 'scalar/str' },
        { op: 'put', key: 'k', value: 1 },
        { op: 'put', key: 'k', value: { now: 2 } },
        { op: 'get', key: 'k' },
        { op: 'delete', key: 'k' },
        { op: 'delete', key: 'never-written' },
        { op: 'get', key: 'k' },
      ]),
    );
    assert.deepEqual(got, [undefined, undefined, undefined, undefined, sample, null, '', undefined, undefined, { now: 2 }, undefined, undefined, undefined]);

    const scanDb = freshDb();
    const keys = ['too', 'tool', 'tool/a', 'tool/ab', 'tool0', 'tools/x', 'toom', 'u', 'a', 'p\uffff', 'p\uffff\uffffz', 'p\uffffa', 'pé'];
    const [, ...scans] = values(
      await ops(scanDb, [
        { op: 'batch', ops: [...keys].reverse().map((key) => ({ type: 'put', key, value: { key } })) },
        { op: 'scan', prefix: 'tool/' },
        { op: 'scan', prefix: 'tool' },
        { op: 'scan', prefix: 'tool/abc' },
        { op: 'scan', prefix: 'p\uffff' },
        { op: 'scan', prefix: '' },
      ]),
    ) as Array<Array<[string, unknown]>>;
    assert.deepEqual(scans[0], [
      ['tool/a', { key: 'tool/a' }],
      ['tool/ab', { key: 'tool/ab' }],
    ]);
    assert.deepEqual(scans[1]!.map(([k]) => k), ['tool', 'tool/a', 'tool/ab', 'tool0', 'tools/x']);
    assert.deepEqual(scans[2], []);
    assert.deepEqual(scans[3]!.map(([k]) => k), ['p\uffff', 'p\uffff\uffffz', 'p\uffffa'].sort());
    assert.deepEqual(
      scans[4]!.map(([k]) => k),
      [...keys].sort(),
    );
    tab.assertClean();
  });

  test('stores with their own storeName in one database, opened at once, all open', async () => {
    // Each store's first op upgrades the database to add its object store; the others' upgrades
    // keep moving the version under it.
    const name = freshDb();
    const storeNames = Array.from({ length: 12 }, (_, i) => `agent${i}`);
    const results = await Promise.all(storeNames.map((storeName, i) => ops(name, [{ op: 'put', key: 'k', value: i }, { op: 'get', key: 'k' }], storeName)));
    assert.deepEqual(results.map(values), storeNames.map((_, i) => [undefined, i]));
  });

  test('Web Locks the browser refuses (no site data kept) fail a lock as store_error, not a raw SecurityError', async () => {
    const result = await callInPage<{ error?: { code?: string; name?: string; message: string } }>(tab.page, 'lockWhileLocksRefused', freshDb(), 'agent:a1');
    assert.equal(result.error?.name, 'StoreError', JSON.stringify(result));
    assert.equal(result.error?.code, 'store_error');
    assert.match(result.error!.message, /refused the Web Lock 'agent:a1': The request was denied/);
  });

  test('a batch applies its ops in order in one transaction', async () => {
    const db = freshDb();
    const [, , scan] = values(
      await ops(db, [
        { op: 'put', key: 'old', value: 1 },
        {
          op: 'batch',
          ops: [
            { type: 'put', key: 'a', value: 1 },
            { type: 'delete', key: 'a' },
            { type: 'delete', key: 'b' },
            { type: 'put', key: 'b', value: 2 },
            { type: 'delete', key: 'old' },
          ],
        },
        { op: 'scan', prefix: '' },
      ]),
    );
    assert.deepEqual(scan, [['b', 2]]);
  });

  for (const how of ['sync', 'async'] as const) {
    test(`a batch whose IndexedDB request fails ${how === 'sync' ? 'at once' : 'later (ConstraintError)'} writes nothing`, async () => {
      const db = freshDb();
      // `async`: an add over 'first', which the same batch has just put.
      await callInPage(tab.page, 'sabotagePut', 'boom', how, 'first');
      try {
        const [, failed, scan] = await ops(db, [
          { op: 'put', key: 'existing', value: 'before' },
          {
            op: 'batch',
            ops: [
              { type: 'put', key: 'first', value: 1 },
              { type: 'delete', key: 'existing' },
              { type: 'put', key: 'boom', value: 2 },
              { type: 'put', key: 'last', value: 3 },
            ],
          },
          { op: 'scan', prefix: '' },
        ]);
        assert.equal(failed!.error?.code, 'store_error', JSON.stringify(failed));
        assert.match(failed!.error!.message, how === 'sync' ? /DataError/ : /ConstraintError/);
        assert.deepEqual(scan!.value, [['existing', 'before']], 'nothing of the failed batch is visible');
      } finally {
        await callInPage(tab.page, 'restorePut');
      }
    });
  }

  test('a value the JSON checks refuse writes nothing of its batch', async () => {
    const db = freshDb();
    const result = await callInPage<Result>(tab.page, 'putWithBadValue', db);
    assert.equal(result.error?.code, 'store_error');
    assert.deepEqual(values(await ops(db, [{ op: 'scan', prefix: '' }])), [[]]);
  });

  test('records survive a page reload; a batch cut off by the reload is all or nothing', async () => {
    const db = freshDb();
    values(
      await ops(db, [
        { op: 'put', key: 'tool/b', value: sample },
        { op: 'batch', ops: [{ type: 'put', key: 'tool/a', value: [1, 2, 3] }, { type: 'put', key: 'run/1', value: { state: 'paused' } }] },
        { op: 'delete', key: 'run/1' },
      ]),
    );
    const issued = await callInPage<number>(tab.page, 'beginBatch', db, 500);
    await tab.page.reload({ waitUntil: 'load' });
    const [all, crash] = values(await ops(db, [{ op: 'scan', prefix: 'tool/' }, { op: 'scan', prefix: 'crash/' }])) as Array<Array<[string, unknown]>>;
    assert.deepEqual(all, [
      ['tool/a', [1, 2, 3]],
      ['tool/b', sample],
    ]);
    assert.ok(crash!.length === 0 || crash!.length === issued, `the interrupted batch left ${crash!.length} of ${issued} records`);
    console.log(`# the batch interrupted by the reload was ${crash!.length === 0 ? 'rolled back' : 'committed whole'}`);
    tab.assertClean();
  });

  test('random op sequences read back what a sorted map would, also after a reload', async () => {
    const db = freshDb();
    const { ops: list, results, final } = randomStoreOps(0x1db5eed, iterations(300), sample);
    assert.deepEqual(await ops(db, list), results);
    await tab.page.reload({ waitUntil: 'load' });
    assert.deepEqual(await ops(db, [{ op: 'scan', prefix: '' }]), [{ value: final }]);
  });

  test('two tabs of the same origin writing interleaved keys at once lose nothing', async () => {
    const db = freshDb();
    const second = watchPage(await context.newPage());
    await second.page.goto(`${site.url}/`);
    try {
      const count = 150;
      const [a, b] = await Promise.all([
        callInPage<{ start: number; end: number }>(tab.page, 'concurrentWriter', db, 'a', count),
        callInPage<{ start: number; end: number }>(second.page, 'concurrentWriter', db, 'b', count),
      ]);
      assert.ok(a.start < b.end && b.start < a.end, `the two tabs' writes overlapped in time: a ${JSON.stringify(a)}, b ${JSON.stringify(b)}`);
      const expected = 2 * count + 2 * Math.ceil(count / 10) + Math.ceil(count / 10);
      for (const page of [tab, second]) {
        const [all] = values(await ops(db, [{ op: 'scan', prefix: 'w/' }], undefined, page)) as Array<Array<[string, unknown]>>;
        assert.equal(all!.length, expected, 'every acknowledged write of both tabs is there');
        const byKey = new Map(all);
        for (let i = 0; i < count; i++) {
          const n = String(i).padStart(4, '0');
          assert.deepEqual(byKey.get(`w/${n}/a`), { by: 'a', i });
          assert.deepEqual(byKey.get(`w/${n}/b`), { by: 'b', i });
        }
        for (let i = 0; i < count; i += 10) assert.ok(['a', 'b'].includes(byKey.get(`w/shared/${i}`) as string));
      }
      second.assertClean();
      tab.assertClean();
    } finally {
      await second.page.close();
    }
  });

  test('a tab upgrading the database makes the other tab step aside and reopen, not block', async () => {
    const db = freshDb();
    const second = watchPage(await context.newPage());
    await second.page.goto(`${site.url}/`);
    try {
      values(await ops(db, [{ op: 'put', key: 'k', value: 'from a' }]));
      // A second object store in the same database needs a version upgrade; tab a holds a connection.
      const [put, get] = values(await ops(db, [{ op: 'put', key: 'k', value: 'from b' }, { op: 'get', key: 'k' }], 'other', second));
      assert.deepEqual([put, get], [undefined, 'from b']);
      assert.deepEqual(values(await ops(db, [{ op: 'get', key: 'k' }, { op: 'put', key: 'k2', value: 2 }])), ['from a', undefined]);
      second.assertClean();
      tab.assertClean();
    } finally {
      await second.page.close();
    }
  });

  test('the store benchmark runs in Chromium against idb-keyval (one round; full: npm run bench:stores:browser)', async () => {
    const { rows, version } = await runBrowserStoreBench(1, undefined, browser);
    assert.deepEqual(rows.map((r) => r.name), ['idb-keyval (Chromium)', 'indexedDbStore (Chromium)']);
    for (const row of rows) assert.ok(row.totalMs > 0 && Number.isFinite(row.totalMs));
    console.log(`# Chromium ${version}, one round\n${formatStoreBench(rows).replace(/^/gm, '# ')}`);
  });
});
