import { AsyncLocalStorage } from 'node:async_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { RetrysafeError } from '../../core/contract/index.js';
import { timerMs } from '../../core/options/index.js';
import type { SqlDriver, SqlResult, TransactionOptions } from '../sql/driver.js';
import {
  type Driver,
  driverOf,
  isBusyError,
  openReader,
  pragmaValue,
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
 * A group commit's bounds: a transaction joins the group only while it has fewer members and is
 * younger than these, so the first member's answer waits at most about this long for the commit
 * (plus the last member's own work). Under 10 concurrent requests a group holds about 5 (measured
 * on the loan desk).
 */
const GROUP_MAX_MEMBERS = 64;
const GROUP_MAX_MS = 4;
const MEMBER_SAVEPOINT = 'retrysafe_member';

/**
 * Compiled statements kept per connection. The SQL store's texts are a few dozen; the bound keeps
 * an application sending ever new texts through `query` from growing the cache without end.
 */
const STATEMENT_CACHE_SIZE = 200;

/** Caches `value` under `text`, first dropping the oldest entry of a full cache; answers `value`. */
function remember<T>(cache: Map<string, T>, text: string, value: T): T {
  if (cache.size >= STATEMENT_CACHE_SIZE) cache.delete(cache.keys().next().value!);
  cache.set(text, value);
  return value;
}

/** Runs functions one after another, each after the previous one's promise settles. */
export class SerialQueue {
  #tail: Promise<unknown> = Promise.resolve();
  #pending = 0;

  /** Nothing queued or running: a turn through the queue would find it empty. */
  get idle(): boolean {
    return this.#pending === 0;
  }

  /** Something is queued behind the function now running. */
  get waiting(): boolean {
    return this.#pending > 1;
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

/** How one caller of the root queue is answered: at once, or when its group commits. */
interface Answer<T> {
  resolve(value: T): void;
  reject(error: unknown): void;
}

/** What a turn of the root queue came to: its value, or what it threw. */
type Outcome<T> = { value: T } | { error: unknown };

function deliver<T>(outcome: Outcome<T>, answer: Answer<T>): void {
  if ('error' in outcome) answer.reject(outcome.error);
  else answer.resolve(outcome.value);
}

/**
 * The connection's open group commit: one `BEGIN IMMEDIATE` that the transactions and statements
 * queued on the connection run inside, one after another, each transaction in a savepoint of its
 * own. `settle` answers every member once the group's COMMIT has run (or failed).
 */
interface Group {
  startedMs: number;
  /** Its commit is scheduled (for the event loop's check phase). */
  closing?: boolean;
  /** One per member, in order: called with the commit's failure, or with nothing once committed. */
  settle: ((failure: { error: unknown } | undefined) => void)[];
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
  /**
   * Waits for the transactions queued or open on the connection and commits them, then closes the
   * driver's reader, and the connection too unless `closeConnection` is `false` (one the caller
   * opened and closes).
   */
  close(closeConnection?: boolean): Promise<void>;
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
  const busyTimeoutMs = pragmaValue(db, 'busy_timeout') as number;
  const compiled = new Map<string, Compiled>();
  const reader = openReader(db, busyTimeoutMs);
  const readerStatements = new Map<string, Statement>();
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
    return remember(compiled, text, found);
  }

  function execute<Row>(
    { statement, reader, readonly }: Compiled,
    params: readonly unknown[],
  ): SqlResult<Row> {
    if (!reader) return { rows: [], affected: Number(statement.run(...params).changes) };
    const rows = statement.all(...params) as Row[];
    return { rows, affected: readonly ? 0 : rows.length };
  }

  function openFrame(): Frame {
    openFrames++;
    return { open: true, queue: new SerialQueue() };
  }

  /** Statements a transaction's work started but did not await still belong to it: waits for them. */
  function drained(frame: Frame): Promise<void> | undefined {
    return frame.queue.idle ? undefined : frame.queue.run(() => undefined);
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

  let group: Group | undefined;

  /** Commits the open group, then answers its members: each with the commit's error if it failed. */
  function commitGroup(): void {
    const closing = group;
    if (!closing) return;
    group = undefined;
    let failure: { error: unknown } | undefined;
    try {
      commitStatement.run();
    } catch (error) {
      failure = { error };
      if (db.inTransaction()) rollbackStatement.run();
    }
    for (const settle of closing.settle) settle(failure);
  }

  /**
   * Ends a turn of the root queue that ran inside `joined`, answering `answer` by `outcome` once
   * the group commits. The group stays open for what is queued behind while it is small and young;
   * else it commits now. A turn that ended the group's transaction (a member's rollback as the
   * group's first, or its work's own COMMIT or ROLLBACK) answers at once, and every member before
   * it with an error: whether their writes were committed is unknown to them, so they must be
   * retried, which replays or runs them again.
   */
  function endTurn<T>(joined: Group, outcome: Outcome<T>, answer: Answer<T>): void {
    if (!db.inTransaction()) {
      if (group === joined) group = undefined;
      const lost = new RetrysafeError(
        'sqlite: the transaction this one shared its commit with was ended by another work (a rollback, or a raw COMMIT or ROLLBACK); retry it',
      );
      for (const settle of joined.settle) settle({ error: lost });
      deliver(outcome, answer);
      return;
    }
    joined.settle.push((failure) => deliver(failure && !('error' in outcome) ? failure : outcome, answer));
    const keepOpen =
      (root.waiting || reader !== undefined) &&
      joined.settle.length < GROUP_MAX_MEMBERS &&
      Date.now() - joined.startedMs < GROUP_MAX_MS;
    if (!keepOpen) commitGroup();
    else if (!root.waiting && !joined.closing) {
      // Nothing queued yet: requests that arrive in this turn of the event loop (other sockets
      // read in the same poll) join the group; it commits in the turn's check phase, in its own
      // turn of the queue. Reads meanwhile go to the reader, so none waits for this commit.
      joined.closing = true;
      setImmediate(() => (root.idle ? commitGroup() : void root.run(commitGroup)));
    }
  }

  /**
   * Runs `fn` in its turn on the root queue. Inside an open group a statement that `joins` runs in
   * it and is answered after its commit (a read there sees the group's uncommitted writes);
   * anything else commits the group first.
   */
  function inTurn<T>(fn: () => T | Promise<T>, joins: boolean): Promise<T> {
    if (root.idle && !group) return root.run(fn);
    return new Promise<T>((resolve, reject) => {
      void root.run(async () => {
        const joined = joins ? group : undefined;
        if (!joined) {
          commitGroup();
          try {
            resolve(await fn());
          } catch (error) {
            reject(error);
          }
          return;
        }
        let outcome: Outcome<T>;
        try {
          outcome = { value: await fn() };
        } catch (error) {
          outcome = { error };
        }
        endTurn(joined, outcome, { resolve, reject });
      });
    });
  }

  /**
   * A read outside any transaction, on the reader: it sees what has committed, at once, instead of
   * queueing behind the transactions and the open group of the connection.
   */
  async function readCommitted<Row>(text: string, params: readonly unknown[]): Promise<SqlResult<Row>> {
    const statement = readerStatements.get(text) ?? remember(readerStatements, text, reader!.prepare(text));
    return { rows: statement.all(...params) as Row[], affected: 0 };
  }

  // While a transaction is open on the connection, any statement run on it joins that
  // transaction; so every statement goes through the queue of the innermost open one.
  function exclusive<T>(fn: (connection: Driver) => T | Promise<T>): Promise<T> {
    const frame = frames.getStore();
    if (frame?.open) return frame.queue.run(() => fn(db));
    return inTurn(() => fn(db), false);
  }

  const isBusy = (error: unknown, deadlineMs: number) => isBusyError(error) && Date.now() < deadlineMs;

  // SQLite applies busy_timeout when it prepares the PRAGMA, so neither can be a cached statement;
  // one exec with the BEGIN costs one call instead of three.
  const restoreBusy = `PRAGMA busy_timeout = ${busyTimeoutMs}`;
  const beginUnlocked = `PRAGMA busy_timeout = 0; BEGIN IMMEDIATE; ${restoreBusy}`;
  // Cached: preparing COMMIT per transaction cost more than running it.
  const commitStatement = db.prepare('COMMIT');
  // A group's members after its first run one at a time, each in this savepoint: one name, prepared once.
  const saveMember = db.prepare(`SAVEPOINT ${MEMBER_SAVEPOINT}`);
  const releaseMember = db.prepare(`RELEASE ${MEMBER_SAVEPOINT}`);
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

  /** A transaction inside another of this driver's: a savepoint, in the outer one's queue. */
  function nestedTransaction<T>(queue: SerialQueue, work: (tx: D) => Promise<T>): Promise<T> {
    return queue.run(async () => {
      const savepoint = `retrysafe_${++savepoints}`;
      db.exec(`SAVEPOINT ${savepoint}`);
      const frame = openFrame();
      try {
        const value = await frames.run(frame, () => work(database));
        const draining = drained(frame);
        if (draining) await draining;
        closeFrame(frame);
        db.exec(`RELEASE ${savepoint}`);
        return value;
      } catch (error) {
        closeFrame(frame);
        // SQLite rolls back by itself on some errors (and a handler may have ended the
        // transaction); a second ROLLBACK would mask the first error.
        if (db.inTransaction()) db.exec(`ROLLBACK TO ${savepoint}; RELEASE ${savepoint}`);
        throw error;
      }
    });
  }

  /**
   * A top-level transaction, as a member of a group commit: the first member begins the group
   * (`BEGIN IMMEDIATE`), each later one runs in a savepoint of it, so one that fails rolls back
   * only its own writes. Its answer waits for the group's COMMIT.
   */
  async function member<T>(work: (tx: D) => Promise<T>, deadlineMs: number, answer: Answer<T>) {
    let joined = group;
    let savepoint: string | undefined;
    let outcome: Outcome<T>;
    if (!joined) {
      try {
        const waiting = whenUnlocked(deadlineMs, beginImmediate);
        if (waiting) await waiting;
      } catch (error) {
        answer.reject(error);
        return;
      }
      group = joined = { startedMs: Date.now(), settle: [] };
    }
    const frame = openFrame();
    try {
      if (joined.settle.length > 0) {
        savepoint = MEMBER_SAVEPOINT;
        saveMember.run();
      }
      const value = await frames.run(frame, () => work(database));
      const draining = drained(frame);
      if (draining) await draining;
      closeFrame(frame);
      if (savepoint) releaseMember.run();
      outcome = { value };
    } catch (error) {
      closeFrame(frame);
      // As in a nested transaction; the group's first member has no savepoint: its rollback ends
      // the group, which holds only it.
      if (db.inTransaction()) {
        if (savepoint) db.exec(`ROLLBACK TO ${savepoint}; RELEASE ${savepoint}`);
        else rollbackStatement.run();
      }
      outcome = { error };
    }
    endTurn(joined, outcome, answer);
  }

  function transaction<T>(work: (tx: D) => Promise<T>, options?: TransactionOptions): Promise<T> {
    const frame = frames.getStore();
    if (frame?.open) return nestedTransaction(frame.queue, work);
    // The busy timeout counts from the call: time queued behind this process's own transactions
    // is time waited for the lock too. The store's own bound (its `timeoutMs`, the engine's
    // storeTimeout) shortens it: a write lock held past it fails the call, running nothing.
    const deadlineMs = Date.now() + Math.min(busyTimeoutMs, options?.acquireTimeoutMs ?? busyTimeoutMs);
    return new Promise<T>((resolve, reject) => {
      void root.run(() => member(work, deadlineMs, { resolve, reject }));
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
      const frame = frames.getStore();
      if (frame?.open) return frame.queue.run(() => autocommit(deadlineMs, text, params));
      if (reader) {
        try {
          if (compile(text).readonly) return readCommitted(text, params);
        } catch (error) {
          return Promise.reject(error);
        }
      }
      return inTurn(() => autocommit(deadlineMs, text, params), true);
    },
    // The caller is inside the transaction's work: the connection is its.
    queryIn: async (_tx, text, params) => execute(compile(text), params),
    transaction,
    errorCode: sqliteErrorCode,
    exclusive,
    async close(closeConnection = true) {
      await inTurn(() => undefined, false);
      reader?.close();
      if (closeConnection) db.close();
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
