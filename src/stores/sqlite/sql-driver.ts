import { AsyncLocalStorage } from 'node:async_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { timerMs } from '../../core/options/index.js';
import type { SqlDriver, SqlResult, TransactionOptions } from '../sql/driver.js';
import {
  type Driver,
  driverOf,
  isBusyError,
  type SqliteDatabase,
  type SqliteDriverName,
  type Statement,
} from './driver.js';

/**
 * The longest pause between two tries for the write lock held by another process. SQLite's own
 * busy handler sleeps up to 100 ms between tries; shorter keeps a lock freed by a short
 * transaction from sitting idle, and a try costs microseconds.
 */
const MAX_LOCK_RETRY_MS = 25;

/**
 * Compiled statements kept per connection. The SQL store's texts are a few dozen; the bound keeps
 * an application sending ever new texts through `query` from growing the cache without end.
 */
const STATEMENT_CACHE_SIZE = 200;

/** Runs functions one after another, each after the previous one's promise settles. */
export class SerialQueue {
  #tail: Promise<unknown> = Promise.resolve();
  #pending = 0;

  /** Nothing queued or running: a turn through the queue would find it empty. */
  get idle(): boolean {
    return this.#pending === 0;
  }

  run<T>(fn: () => T | Promise<T>): Promise<T> {
    // Nothing ahead: `fn` runs in this turn, and only a `fn` that is still running holds the queue.
    if (this.#pending === 0) {
      let value: T | Promise<T>;
      try {
        value = fn();
      } catch (error) {
        return Promise.reject(error);
      }
      if (!(value instanceof Promise)) return Promise.resolve(value);
      return this.#hold(value);
    }
    return this.#hold(this.#tail.then(fn));
  }

  #hold<T>(result: Promise<T>): Promise<T> {
    this.#pending++;
    this.#tail = result.then(
      () => void this.#pending--,
      () => void this.#pending--,
    );
    return result;
  }
}

/** An open transaction of the driver; statements started inside it use its own queue. */
interface Frame {
  open: boolean;
  queue: SerialQueue;
}

/** A compiled statement and how to run it. */
interface Compiled {
  statement: Statement;
  /** It answers rows (a SELECT, a RETURNING): run with `all`. */
  reader: boolean;
  /** It changes nothing (a SELECT): its count of changed rows is 0. */
  readonly: boolean;
}

/** A SQL driver over one SQLite connection, with what only SQLite needs. */
export interface SqliteDriver<D extends SqliteDatabase = SqliteDatabase> extends SqlDriver<D> {
  readonly name: 'sqlite';
  /** The binding the connection belongs to. */
  readonly binding: SqliteDriverName;
  /** The connection: every statement runs on it, and it is `tx` in a transaction. */
  readonly database: D;
  /** The connection's busy timeout: how long a write waits for another connection's lock. */
  readonly busyTimeoutMs: number;
  /**
   * Runs `fn` on the connection once no transaction of this driver holds it (at once inside one:
   * it then joins that transaction), and answers what `fn` answered.
   */
  exclusive<T>(fn: (connection: Driver) => T | Promise<T>): Promise<T>;
  /** Waits for the transactions queued or open on the connection, then closes it. */
  close(): Promise<void>;
}

/**
 * The SQL store's driver over a better-sqlite3 `Database` or a node:sqlite `DatabaseSync`: one
 * connection, which is the transaction object (`tx`) too. A transaction is `BEGIN IMMEDIATE`: it
 * holds the write lock from its first statement to its commit, so a claim and the row it met see
 * one state across processes. An async transaction may await while open: every other statement
 * of the driver queues until it ends instead of silently joining it; one started inside it (the
 * work's own, in its async context) joins it, and a `transaction()` there is a savepoint.
 *
 * Another process's write lock is waited for without blocking the event loop when a transaction
 * begins (SQLite's own busy handler sleeps synchronously, stalling every request of the process);
 * a statement in autocommit waits the connection's busy timeout, synchronously.
 */
export function sqliteDriver<D extends SqliteDatabase>(
  database: D,
  options: Pick<SqlDriver<D>, 'now' | 'pollDelays'> = {},
): SqliteDriver<D> {
  const db = driverOf(database);
  const busyTimeoutMs = Object.values(db.prepare('PRAGMA busy_timeout').get() as object)[0] as number;
  const compiled = new Map<string, Compiled>();
  const root = new SerialQueue();
  const frames = new AsyncLocalStorage<Frame>();
  let savepoints = 0;
  let openFrames = 0;

  function compile(text: string): Compiled {
    let found = compiled.get(text);
    if (found) return found;
    const statement = db.prepare(text);
    const { reader, readonly } = statement as { reader?: boolean; readonly?: boolean };
    const columns = (statement as { columns?: () => unknown[] }).columns;
    found = {
      statement,
      // better-sqlite3 says; node:sqlite (≥ 22.16) lists the result's columns.
      reader:
        reader ??
        (columns
          ? columns.call(statement).length > 0
          : /^\s*(select|pragma|with)\b|\breturning\b/i.test(text)),
      readonly: readonly ?? /^\s*(select|pragma)\b/i.test(text),
    };
    if (compiled.size >= STATEMENT_CACHE_SIZE) compiled.delete(compiled.keys().next().value!);
    compiled.set(text, found);
    return found;
  }

  function execute<Row>(
    { statement, reader, readonly }: Compiled,
    params: readonly unknown[],
  ): SqlResult<Row> {
    if (!reader) return { rows: [], affected: Number(statement.run(...params).changes) };
    const rows = statement.all(...params) as Row[];
    return { rows, affected: readonly ? 0 : rows.length };
  }

  /**
   * Ends a transaction's frame. With none open, `frames` is disabled until the next transaction:
   * on Node 20 an AsyncLocalStorage in use runs async hooks on every promise and native handle of
   * the process: about 3 µs of CPU per loan desk request, replays and GETs included, measured in
   * process. Code still holding a closed frame then reads none, which `exclusive` treats alike.
   */
  function closeFrame(frame: Frame): void {
    if (!frame.open) return;
    frame.open = false;
    if (--openFrames === 0) frames.disable();
  }

  // While a transaction is open on the connection, any statement run on it joins that
  // transaction; so every statement goes through the queue of the innermost open one.
  function exclusive<T>(fn: (connection: Driver) => T | Promise<T>): Promise<T> {
    const frame = frames.getStore();
    return (frame?.open ? frame.queue : root).run(() => fn(db));
  }

  const isBusy = (error: unknown, deadlineMs: number) => isBusyError(error) && Date.now() < deadlineMs;

  // SQLite applies busy_timeout when it prepares the PRAGMA, so neither can be a cached statement;
  // one exec with the BEGIN costs one call instead of three.
  const restoreBusy = `PRAGMA busy_timeout = ${busyTimeoutMs}`;
  const beginUnlocked = `PRAGMA busy_timeout = 0; BEGIN IMMEDIATE; ${restoreBusy}`;
  // Cached: preparing COMMIT per transaction cost more than running it.
  const commitStatement = db.prepare('COMMIT');
  const rollbackStatement = db.prepare('ROLLBACK');

  /** `BEGIN IMMEDIATE` without SQLite's synchronous wait for the lock. */
  function beginImmediate(): void {
    try {
      db.exec(beginUnlocked);
    } catch (error) {
      db.exec(restoreBusy);
      throw error;
    }
  }

  /**
   * Runs `attempt`, which takes the write lock without waiting for it, again on `SQLITE_BUSY`
   * until `deadlineMs`. Only a lock held by another connection costs a promise; a free one is
   * taken in this turn.
   */
  function whenUnlocked<T>(deadlineMs: number, attempt: () => T): T | Promise<T> {
    try {
      return attempt();
    } catch (error) {
      if (!isBusy(error, deadlineMs)) throw error;
    }
    return (async () => {
      for (let pauseMs = 1; ; pauseMs = Math.min(pauseMs * 2, MAX_LOCK_RETRY_MS)) {
        await sleep(timerMs(Math.max(1, Math.min(pauseMs, deadlineMs - Date.now()))));
        try {
          return attempt();
        } catch (error) {
          if (!isBusy(error, deadlineMs)) throw error;
        }
      }
    })();
  }

  /**
   * One statement in autocommit: a write waits for another connection's lock without blocking
   * the event loop (inside a transaction the connection holds the lock already, and a read in WAL
   * never waits).
   */
  function autocommit<Row>(
    deadlineMs: number,
    text: string,
    params: readonly unknown[],
  ): SqlResult<Row> | Promise<SqlResult<Row>> {
    const statement = compile(text);
    if (statement.readonly || db.inTransaction()) return execute<Row>(statement, params);
    return whenUnlocked(deadlineMs, () => {
      db.exec('PRAGMA busy_timeout = 0');
      try {
        return execute<Row>(statement, params);
      } finally {
        db.exec(restoreBusy);
      }
    });
  }

  function transaction<T>(work: (tx: D) => Promise<T>, options?: TransactionOptions): Promise<T> {
    const nested = frames.getStore()?.open === true;
    // The busy timeout counts from the call: time queued behind this process's own transactions
    // is time waited for the lock too. The store's own bound (its `timeoutMs`, the engine's
    // storeTimeout) shortens it: a write lock held past it fails the call, running nothing.
    const deadlineMs = Date.now() + Math.min(busyTimeoutMs, options?.acquireTimeoutMs ?? busyTimeoutMs);
    return exclusive(async () => {
      const savepoint = nested ? `retrysafe_${++savepoints}` : undefined;
      if (savepoint) db.exec(`SAVEPOINT ${savepoint}`);
      else {
        const waiting = whenUnlocked(deadlineMs, beginImmediate);
        if (waiting) await waiting;
      }
      const frame: Frame = { open: true, queue: new SerialQueue() };
      openFrames++;
      try {
        const value = await frames.run(frame, () => work(database));
        // Statements the work started but did not await still belong to this transaction.
        if (!frame.queue.idle) await frame.queue.run(() => undefined);
        closeFrame(frame);
        if (savepoint) db.exec(`RELEASE ${savepoint}`);
        else commitStatement.run();
        return value;
      } catch (error) {
        closeFrame(frame);
        // SQLite rolls back by itself on some errors (and a handler may have ended the
        // transaction); a second ROLLBACK would mask the first error.
        if (db.inTransaction()) {
          if (savepoint) db.exec(`ROLLBACK TO ${savepoint}; RELEASE ${savepoint}`);
          else rollbackStatement.run();
        }
        throw error;
      }
    });
  }

  return {
    dialect: 'sqlite',
    name: 'sqlite',
    binding: db.name,
    database,
    busyTimeoutMs,
    now: options.now,
    pollDelays: options.pollDelays,
    query(text, params) {
      const deadlineMs = Date.now() + busyTimeoutMs;
      return exclusive(() => autocommit(deadlineMs, text, params));
    },
    // The caller is inside the transaction's work: the connection is its.
    queryIn: async (_tx, text, params) => execute(compile(text), params),
    transaction,
    errorCode: sqliteErrorCode,
    exclusive,
    async close() {
      await root.run(() => undefined);
      db.close();
    },
  };
}

/** node:sqlite numbers its errors (`errcode`); better-sqlite3 names them (`code`) as SQLite does. */
const NAMED_CODES: Record<number, string> = {
  1: 'SQLITE_ERROR',
  5: 'SQLITE_BUSY',
  6: 'SQLITE_LOCKED',
  8: 'SQLITE_READONLY',
  19: 'SQLITE_CONSTRAINT',
};

/** SQLite's code for `error` (`SQLITE_BUSY`, `SQLITE_CONSTRAINT_PRIMARYKEY`), from either binding. */
export function sqliteErrorCode(error: unknown): string | undefined {
  const { code, errcode } = (error ?? {}) as { code?: unknown; errcode?: unknown };
  if (typeof code === 'string' && code.startsWith('SQLITE_')) return code;
  if (typeof errcode === 'number') return NAMED_CODES[errcode & 0xff];
  return undefined;
}
