/**
 * What the running wasm core holds, read through wasm-bindgen internals (tests only): leak
 * tests count the JS functions in its table of JS values, where every host callback a core
 * keeps (and every closure a wait leaves behind) sits, and bound tests read the size of its
 * memory. Fails loudly if those internals change.
 */
import { initSync } from '../../wasm/crucible_core.js';

/** The JS functions the core's wasm instance holds now. The core must be loaded already. */
export function functionsHeldByCore(): number {
  // With the instance loaded, `initSync()` returns its exports.
  const exports = (initSync as unknown as () => { __wbindgen_externrefs?: WebAssembly.Table } | undefined)();
  const table = exports?.__wbindgen_externrefs;
  if (!(table instanceof WebAssembly.Table)) {
    throw new Error('wasm-bindgen internals changed: the core exports no __wbindgen_externrefs table (update test/support/core-internals.ts)');
  }
  let functions = 0;
  for (let i = 0; i < table.length; i++) if (typeof table.get(i) === 'function') functions++;
  return functions;
}

/** Runs the garbage collector (exposed on demand) until finalizers have had their turn. */
export async function collectGarbage(): Promise<void> {
  const { setFlagsFromString } = await import('node:v8');
  const { runInNewContext } = await import('node:vm');
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  for (let i = 0; i < 10; i++) {
    gc();
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** The bytes of the core's wasm memory now (it grows, and never shrinks). The core must be
 *  loaded already. */
export function coreMemoryBytes(): number {
  const exports = (initSync as unknown as () => { memory?: WebAssembly.Memory } | undefined)();
  if (!(exports?.memory instanceof WebAssembly.Memory)) {
    throw new Error('wasm-bindgen internals changed: the core exports no memory (update test/support/core-internals.ts)');
  }
  return exports.memory.buffer.byteLength;
}
