/**
 * The Node store: a LevelDB database (through `classic-level`) in a directory on disk.
 * Node-only; reached through the Node entry point (`node-entry.ts`), never the browser one.
 *
 * Guarantee: a resolved `put`/`delete`/`batch` is in LevelDB's write-ahead log and fsync'ed
 * (`sync: true`), so it survives a killed process, an OS crash and a power cut. A batch is one
 * log record: after any crash all of it or none of it is visible. LevelDB holds an exclusive
 * lock on the directory: one process (one open store) owns a path at a time; a second open
 * fails with `store_blocked`. Why LevelDB: see `README.md` in this folder.
 */

import { isRecord, StoreError } from '../errors.js';
import type { BatchOp, JsonValue, Store } from './types.js';
import { checkBatch, checkKey, decodeJson, encodeJson } from './values.js';

/** Options of {@link nodeStore}. */
export interface NodeStoreOptions {
  /** Directory of the database; created if missing. One open store owns it at a time. */
  path: string;
}

/**
 * Opens (creating if missing) a durable {@link Store} in the directory `path`.
 * Rejects with `store_blocked` when another store, in this or another process, has it open,
 * and with `store_error` when `path` is missing, `classic-level` (an optional dependency) is not
 * installed or the database cannot be opened.
 */
export async function nodeStore(options: NodeStoreOptions): Promise<Store> {
  if (!isRecord(options)) {
    throw new StoreError('store_error', "nodeStore needs an options object with a directory `path`, e.g. nodeStore({ path: './.crucible' })");
  }
  const { path } = options;
  if (typeof path !== 'string' || path === '') {
    throw new StoreError('store_error', "nodeStore needs a directory `path`: a non-empty string, e.g. nodeStore({ path: './.crucible' })");
  }

  let ClassicLevel: typeof import('classic-level').ClassicLevel;
  try {
    ({ ClassicLevel } = await import('classic-level'));
  } catch (err) {
    throw new StoreError('store_error', 'nodeStore needs the optional dependency `classic-level`; install it', {
      cause: err,
    });
  }

  // We encode values ourselves (checked strict JSON) and store them as UTF-8 text.
  const db = new ClassicLevel<string, string>(path, { keyEncoding: 'utf8', valueEncoding: 'utf8' });
  try {
    await db.open({ createIfMissing: true });
  } catch (err) {
    throw toStoreError(err, 'open', path);
  }

  const durable = { sync: true } as const;
  const guard = async <T>(what: string, op: () => Promise<T>): Promise<T> => {
    try {
      return await op();
    } catch (err) {
      throw toStoreError(err, what, path);
    }
  };

  return {
    async get(key: string): Promise<JsonValue | undefined> {
      checkKey(key);
      const text = await guard('get', () => db.get(key));
      return text === undefined ? undefined : decodeJson(text, key);
    },
    async put(key: string, value: JsonValue): Promise<void> {
      checkKey(key);
      const text = encodeJson(value, key);
      await guard('put', () => db.put(key, text, durable));
    },
    async delete(key: string): Promise<void> {
      checkKey(key);
      await guard('delete', () => db.del(key, durable));
    },
    async scan(prefix: string): Promise<Array<[string, JsonValue]>> {
      checkKey(prefix);
      return guard('scan', async () => {
        const out: Array<[string, JsonValue]> = [];
        // Keys sharing a prefix are contiguous in LevelDB's byte order: seek, read until the
        // first key that does not start with it. (An iterator reads from one implicit snapshot.)
        for await (const [key, text] of db.iterator({ gte: prefix })) {
          if (!key.startsWith(prefix)) break;
          out.push([key, decodeJson(text, key)]);
        }
        return out;
      });
    },
    async batch(ops: BatchOp[]): Promise<void> {
      checkBatch(ops);
      if (ops.length === 0) return;
      const ops2 = ops.map((op) =>
        op.type === 'put'
          ? { type: 'put' as const, key: op.key, value: JSON.stringify(op.value) }
          : { type: 'del' as const, key: op.key },
      );
      await guard('batch', () => db.batch(ops2, durable));
    },
    async close(): Promise<void> {
      await guard('close', () => db.close());
    },
  };
}

/** Maps a level error to a typed StoreError. */
function toStoreError(err: unknown, what: string, path: string): StoreError {
  if (err instanceof StoreError) return err;
  const e = err as { code?: unknown; message?: unknown; cause?: { code?: unknown; message?: unknown } };
  const detail = `nodeStore ${what} (${path}): ${String(e?.message ?? err)}${e?.cause?.message ? `: ${String(e.cause.message)}` : ''}`;
  if (e?.code === 'LEVEL_LOCKED' || e?.cause?.code === 'LEVEL_LOCKED') {
    return new StoreError('store_blocked', `${detail} (another store, maybe in another process, has this path open)`, {
      cause: err,
    });
  }
  if (/No space left|ENOSPC|EDQUOT|quota/i.test(detail)) return new StoreError('store_quota', detail, { cause: err });
  return new StoreError('store_error', detail, { cause: err });
}
