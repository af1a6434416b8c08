/**
 * Loads the agent core wasm once per process or page. The platform entry points
 * (`node.ts`, `browser.ts`) register how the bytes are obtained; everything else awaits
 * `loadCore()`.
 */
import * as coreModule from '../wasm/crucible_core.js';
import { CrucibleError, messageOf } from './errors.js';

const { default: initCore, initSync: initCoreSync } = coreModule;

export type CoreModule = typeof coreModule;

/** Instantiates the core wasm; `from` says where it is read from, for the error of a failed load. */
type Loader = { load: () => Promise<void>; from: string };

let loader: Loader | undefined;
let loaded: Promise<CoreModule> | undefined;

/** Called by a platform entry point: how to instantiate the core wasm there. */
export function registerCoreLoader(load: () => Promise<void>, from: string | URL): void {
  loader = { load, from: String(from) };
}

/** Whether the core wasm has begun loading (the loader registered last is then the one used). */
export function coreLoadStarted(): boolean {
  return loaded !== undefined;
}

/** Instantiates from bytes (Node) — synchronous compile is fine off the main thread of a page. */
export function instantiateCoreFromBytes(bytes: BufferSource): void {
  initCoreSync({ module: bytes });
}

/** Instantiates by URL (browsers, bundlers): streaming compile. */
export async function instantiateCoreFromUrl(url: URL): Promise<void> {
  await initCore({ module_or_path: url });
}

/** The loaded core module. */
export function loadCore(): Promise<CoreModule> {
  if (!loaded) {
    if (!loader) throw new Error('crucible-agents: no platform entry point loaded (import "crucible-agents", not a deep path)');
    const { load, from } = loader;
    // The module is already imported (statically: a dynamic import of it too would only make
    // bundlers warn); what waits is the wasm instance behind its exports.
    loaded = load().then(
      () => coreModule,
      (error: unknown) => {
        // Forgotten, so a later createAgent loads again (a network blip, a redeploy, a URL
        // fixed with useCoreWasm): wasm-bindgen keeps an instance only once one has loaded.
        loaded = undefined;
        throw new CrucibleError(
          'core_unavailable',
          `the core wasm could not be loaded from ${from}: ${messageOf(error)} (it must answer with the package's wasm/crucible_core_bg.wasm, and a Content-Security-Policy must allow 'wasm-unsafe-eval'); a later createAgent tries again`,
          { cause: error },
        );
      },
    );
  }
  return loaded;
}
