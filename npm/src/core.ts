/**
 * Loads the agent core wasm once per process or page. The platform entry points
 * (`node.ts`, `browser.ts`) register how the bytes are obtained; everything else awaits
 * `loadCore()`.
 */
import * as coreModule from '../wasm/crucible_core.js';

const { default: initCore, initSync: initCoreSync } = coreModule;

export type CoreModule = typeof coreModule;

type Loader = () => Promise<void>;

let loader: Loader | undefined;
let loaded: Promise<CoreModule> | undefined;

/** Called by a platform entry point: how to instantiate the core wasm there. */
export function registerCoreLoader(load: Loader): void {
  loader = load;
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
    const load = loader;
    // The module is already imported (statically: a dynamic import of it too would only make
    // bundlers warn); what waits is the wasm instance behind its exports.
    loaded = load().then(() => coreModule);
  }
  return loaded;
}
