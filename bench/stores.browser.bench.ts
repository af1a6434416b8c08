/**
 * Store benchmark in Chromium: `indexedDbStore` on the browser's real IndexedDB against a
 * plain `idb-keyval` baseline, in the same page and run. The benchmark body is
 * `stores-core.ts` (shared with the Node benchmark), bundled by esbuild with idb-keyval.
 *
 * Run: cd npm && npm run bench:stores:browser   (= node --import tsx ../bench/stores.browser.bench.ts)
 * Env: BENCH_ROUNDS (default 3). Needs Chromium (/usr/bin/chromium or CRUCIBLE_CHROMIUM).
 */

import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { browserUnavailable, callInPage, launchChromium, modulePage, openPage, startStaticServer } from '../npm/test/browser/harness.js';
import { formatStoreBench, type BenchRow } from './stores-core.js';

/** Bundles the browser half of the benchmark into one ES module (in memory). */
export async function bundleBrowserBench(): Promise<string> {
  // esbuild is a dev dependency of npm/; resolve it from there, not from bench/.
  const fromNpm = createRequire(new URL('../npm/package.json', import.meta.url));
  const { build } = (await import(pathToFileURL(fromNpm.resolve('esbuild')).href)) as typeof import('esbuild');
  const result = await build({
    entryPoints: [fileURLToPath(new URL('./stores.browser-entry.ts', import.meta.url))],
    bundle: true,
    format: 'esm',
    target: 'es2022',
    write: false,
    // Dependencies (idb-keyval) live in npm/node_modules, not beside bench/.
    nodePaths: [fileURLToPath(new URL('../npm/node_modules', import.meta.url))],
    logLevel: 'warning',
  });
  return result.outputFiles[0]!.text;
}

/** Runs the benchmark in `shared` (a page of its own) or else a fresh headless Chromium, and
 *  returns its rows. */
export async function runBrowserStoreBench(rounds: number, log: (line: string) => void = () => {}, shared?: Awaited<ReturnType<typeof launchChromium>>): Promise<{ rows: BenchRow[]; version: string }> {
  const bundle = await bundleBrowserBench();
  const site = await startStaticServer({
    mounts: {},
    files: { '/': modulePage({ title: 'store bench', imports: {}, module: '/bench.js' }), '/bench.js': bundle },
  });
  const browser = shared ?? (await launchChromium());
  try {
    const tab = await openPage(browser, `${site.url}/`);
    tab.page.on('console', (msg) => log(msg.text()));
    tab.page.setDefaultTimeout(0);
    const rows = await callInPage<BenchRow[]>(tab.page, 'runBench', rounds);
    tab.assertClean();
    return { rows, version: browser.version() };
  } finally {
    if (!shared) await browser.close();
    await site.close();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const missing = browserUnavailable();
  if (missing) {
    console.error(`bench:stores:browser needs Chromium: ${missing}`);
    process.exit(1);
  }
  const rounds = Number(process.env.BENCH_ROUNDS ?? 3);
  const { rows, version } = await runBrowserStoreBench(rounds, (line) => console.error(line));
  console.log(`Chromium ${version}, ${rows.length} stores, median of ${rounds} rounds\n`);
  console.log(formatStoreBench(rows));
}
