/** Browser entry point (plain ES modules and bundlers): loads the core wasm by URL. */
import { coreLoadStarted, instantiateCoreFromUrl, registerCoreLoader } from './core.js';
import { CrucibleError } from './errors.js';

const besideThisModule = new URL('../wasm/crucible_core_bg.wasm', import.meta.url);
registerCoreLoader(() => instantiateCoreFromUrl(besideThisModule), besideThisModule);

/**
 * Loads the agent core's wasm from `url` (resolved against the page) instead of from beside
 * this module, for bundlers that copy no assets (esbuild): serve the package's
 * `wasm/crucible_core_bg.wasm` and name it here before the first `createAgent`. Throws
 * `invalid_config` once the core has begun loading, when it would no longer apply (after a
 * failed load, `core_unavailable`, it may be called again).
 */
export function useCoreWasm(url: string | URL): void {
  if (coreLoadStarted()) throw new CrucibleError('invalid_config', 'useCoreWasm: the core wasm is already loading or loaded; call it before the first createAgent');
  const base = (globalThis as { location?: { href: string } }).location?.href;
  const resolved = new URL(url, base);
  registerCoreLoader(() => instantiateCoreFromUrl(resolved), resolved);
}

export * from './index.js';
export * from './stores/browser.js';
