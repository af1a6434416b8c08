/**
 * The stores a browser bundle may import: in-memory and IndexedDB. Never re-export `node.ts`
 * here; it loads a native LevelDB binding.
 */

export { memoryStore } from './memory.js';
export { indexedDbStore } from './indexeddb.js';
export type { IndexedDbStoreOptions } from './indexeddb.js';
export type { BatchOp, JsonValue, Store } from './types.js';
