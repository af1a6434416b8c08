/**
 * The stores of the Node entry point: everything the browser gets, plus the durable on-disk
 * LevelDB store.
 */

export * from './browser.js';
export { nodeStore } from './node.js';
export type { NodeStoreOptions } from './node.js';
