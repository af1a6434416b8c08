/** Browser entry point (plain ES modules and bundlers): loads the core wasm by URL. */
import { instantiateCoreFromUrl, registerCoreLoader } from './core.js';

registerCoreLoader(() => instantiateCoreFromUrl(new URL('../wasm/crucible_core_bg.wasm', import.meta.url)));

export * from './index.js';
export * from './stores/browser.js';
