/** Node entry point: loads the core wasm from the package folder. */
import { setMaxListeners } from 'node:events';
import { readFile } from 'node:fs/promises';
import { instantiateCoreFromBytes, registerCoreLoader } from './core.js';
import { registerListenerBound } from './signals.js';

registerListenerBound((signal) => setMaxListeners(0, signal));

const coreWasm = new URL('../wasm/crucible_core_bg.wasm', import.meta.url);
registerCoreLoader(async () => {
  instantiateCoreFromBytes(await readFile(coreWasm));
}, coreWasm);

export * from './index.js';
export * from './stores/node-entry.js';
