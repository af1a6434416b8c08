/**
 * The store boundary (DESIGN decision 7): get, put, delete, prefix scan and an atomic batch.
 * Values are plain JSON; every record the core writes carries a schema version field `v`.
 * Mirrors the `Store` trait in `src/store/`.
 */

/** A JSON value as kept in a store. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** One operation of an atomic batch. */
export type BatchOp = { type: 'put'; key: string; value: JsonValue } | { type: 'delete'; key: string };

/**
 * A key-value store with lexicographically ordered string keys.
 * `batch` is all-or-nothing: after a crash either every op of it is visible or none is.
 * A resolved promise means the write is durable to the store's guarantee.
 */
export interface Store {
  /**
   * Set by stores whose data other JavaScript contexts (browser tabs, workers) open too: the
   * `BroadcastChannel` name agents on this data use to tell each other about shared-tier
   * changes. `indexedDbStore` sets it; a store without it shares changes within its context.
   */
  readonly broadcastName?: string;
  get(key: string): Promise<JsonValue | undefined>;
  put(key: string, value: JsonValue): Promise<void>;
  delete(key: string): Promise<void>;
  /** Every entry whose key starts with `prefix`, in key order. */
  scan(prefix: string): Promise<Array<[string, JsonValue]>>;
  batch(ops: BatchOp[]): Promise<void>;
  close(): Promise<void>;
  /**
   * Optional, for stores whose data other JavaScript contexts open too: resolves once the lock
   * `name` on this data is held, with the function that releases it. The core holds
   * `shared-stats` while it reads, adds to and writes back shared-tier stats, so agents in two
   * tabs never overwrite each other's counts, and `shared-tier` while it reads the shared tier
   * and approves, demotes or rolls back a tool. `indexedDbStore` implements it with Web Locks
   * where they exist, else within its JavaScript context only.
   */
  lock?(name: string): Promise<() => void>;
  /**
   * Optional, with `lock`: the lock `name` if no context holds it now (its release function),
   * else `undefined`, without waiting. An agent with emergent capabilities holds
   * `agent:<agentId>` while it is open: its registry (tools, stats, audit) has one writer.
   * `storedRuns()` takes and at once releases each run's lock (`run:<agentId>/<runId>`, held
   * while a run or resume of it goes) to list the runs other contexts drive as `running`,
   * asking for up to 32 of them at once.
   */
  tryLock?(name: string): Promise<(() => void) | undefined>;
}
