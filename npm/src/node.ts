/** Node entry point: loads the core wasm from the package folder. */
import { readFile } from 'node:fs/promises';
import { instantiateCoreFromBytes, registerCoreLoader } from './core.js';

registerCoreLoader(async () => {
  instantiateCoreFromBytes(await readFile(new URL('../wasm/crucible_core_bg.wasm', import.meta.url)));
});

export * from './index.js';
export * from './stores/node-entry.js';
