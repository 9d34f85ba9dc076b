import { AsyncLocalStorage } from 'node:async_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import type Database from 'better-sqlite3';
import type {
  AbandonedOptions,
  AbandonedRecord,
  AtomicResult,
  AtomicStore,
  AtomicWorkResult,
  ClaimInput,
  ClaimResult,
  GetKeyOptions,
  KeyPage,
  ListKeysOptions,
  PhaseStore,
  SavedStep,
  StoredResponse,
} from '../../core/contract/index.js';
import { ConfigError, RetrysafeError } from '../../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../../core/options/index.js';
import {
  type AbandonedRow,
  abandonedLimit,
  abandonedOf,
  keyRecordOf,
  keysetPage,
  listRequest,
  newToken,
  pacedDeletes,
  purgeInBatches,
  type ResponseRow,
  recordId,
  requirePositiveInteger,
  type SummaryRow,
  summaryOf,
  Waiters,
} from '../internal.js';
import { pollUntilSettled } from '../poll-wait.js';
import { Ended, TRANSACTION_ENDED_RESPONSE, transactionEnded } from '../transaction-ended.js';
import { walCheckpointer } from './checkpoint.js';
import {
  type Driver,
  driverOf,
  isBusyError,
  type NodeSqliteDatabase,
  openDatabase,
  type SqliteDatabase,
  type SqliteDriverName,
  type Statement,
} from './driver.js';
import { addStepColumns, sqliteMigrationSql, tableName } from './migrate.js';
import { SerialQueue } from './sql-driver.js';
import {
  acquiredOf,
  claimParameters,
  completedOf,
  listParameters,
  listShape,
  type RecordRow,
  type Settled,
  settledOf,
  sqliteStatements,
} from './statements.js';

export type {
  NodeSqliteDatabase,
  NodeSqliteStatement,
  SqliteDatabase,
  SqliteDriverName,
} from './driver.js';
export { sqliteMigrationSql } from './migrate.js';

/** Options of {@link sqliteStore}. */
export interface SqliteStoreOptions<D extends SqliteDatabase = SqliteDatabase> {
  /**
   * The database file to open (created if missing). Give this or `database`, not both.
   * @default undefined
   * @example filename: 'app.db'
   */
  filename?: string;
  /**
   * An open connection to use instead, e.g. the one holding the application's own tables (atomic
   * mode needs that): a better-sqlite3 `Database` or a node:sqlite `DatabaseSync` (Node ≥ 22.16).
   * It is used as configured and `close()` leaves it open.
   * @default undefined
   * @example database: new Database('library.db')
   */
  database?: D;
  /**
   * The SQLite binding that opens `filename`: better-sqlite3 (a native addon), or Node's own
   * node:sqlite (Node ≥ 22.16, nothing to install or rebuild). By default better-sqlite3 where it
   * is installed, node:sqlite where it is not. With `database`, the connection's own.
   * @default 'better-sqlite3' if installed, else 'node:sqlite'
   * @example driver: 'node:sqlite'
   */
  driver?: SqliteDriverName;
  /**
   * The table holding the records; created with its index if missing.
   * @default 'idempotency_keys'
   * @example table: 'loan_keys'
   */
  table?: string;
  /**
   * How long a write waits for another process's write lock before failing with `SQLITE_BUSY`
   * (shortened by a claim's `timeoutMs`). The store's own transactions wait without blocking the
   * event loop; any other statement on the connection waits synchronously, as better-sqlite3 does.
   * Applied to a passed `database` only when set.
   * @default 5000
   */
  busyTimeoutMs?: number;
  /**
   * First delay between the reads of `wait`, doubled after each read up to `maxPollIntervalMs`.
   * A completion in this process wakes the wait at once; polling finds the other processes' ones.
   * @default 10
   */
  pollIntervalMs?: number;
  /**
   * Longest delay between the reads of `wait`.
   * @default 250
   */
  maxPollIntervalMs?: number;
  /**
   * The clock records are stamped and judged by (creation, lease, retention), in ms since the
   * epoch. Tests and demos move it to age keys without waiting.
   * @default Date.now
   * @example now: () => Date.now() + 30 * 86_400_000
   */
  now?: () => number;
}

/** The SQLite store: an {@link AtomicStore} whose transaction handle is the connection itself. */
export interface SqliteStore<D extends SqliteDatabase = SqliteDatabase>
  extends AtomicStore<D>,
    PhaseStore<D> {
  /** The connection; run the application's own statements on it inside {@link SqliteStore.transaction}. */
  readonly database: D;
  /** The binding the connection belongs to. */
  readonly driver: SqliteDriverName;
  /**
   * Runs `fn` in `BEGIN IMMEDIATE` … `COMMIT` (`ROLLBACK` if it throws) on {@link SqliteStore.database}.
   * An async `fn` may await while the transaction is open: every other write of this store in this
   * process queues until it ends, instead of silently joining it. Called inside another transaction
   * of this store (or inside `atomic`'s work) it becomes a savepoint.
   *
   * @example
   * ```ts
   * await store.transaction(async (db) => {
   *   db.prepare('UPDATE account SET balance = balance - ? WHERE id = ?').run(amount, id);
   *   await audit(id);
   * });
   * ```
   */
  transaction<T>(fn: (db: D) => T | Promise<T>): Promise<T>;
}

/**
 * Rows deleted per purge batch. Smaller than the other stores' default: SQLite deletes on the
 * event loop's thread, and a 1,000-row batch held requests back by tens of milliseconds (p99 ×6
 * during a 200k purge in the benchmark, against ×2 with 50-row batches).
 */
const SQLITE_PURGE_BATCH_SIZE = 200;

/**
 * The longest a purge's DELETE should hold the event loop (and the write lock): a batch is split
 * into statements that fit (see pacedDeletes), so a request queued behind the purge waits about
 * this long, not a batch, whatever the table's size and the machine's load make a row cost.
 */
const SQLITE_PURGE_STATEMENT_MS = 1;

/**
 * The longest pause between two tries for the write lock held by another process. SQLite's own
 * busy handler sleeps up to 100 ms between tries; shorter keeps a lock freed by a short
 * transaction from sitting idle, and a try costs microseconds.
 */
const MAX_LOCK_RETRY_MS = 25;

/** An open transaction of this store; operations started inside it use its own queue. */
interface Frame {
  open: boolean;
  queue: SerialQueue;
}

const OPTION_NAMES = optionNames<SqliteStoreOptions>({
  filename: true,
  database: true,
  driver: true,
  table: true,
  busyTimeoutMs: true,
  pollIntervalMs: true,
  maxPollIntervalMs: true,
  now: true,
});

/**
 * An idempotency store in a SQLite file through better-sqlite3 12 or Node's own node:sqlite
 * (Node ≥ 22.16, see `driver`): WAL, safe for several processes on one host. Claims are one `INSERT … ON CONFLICT DO UPDATE … RETURNING`; `atomic`
 * commits the claim, the handler's own writes and the response in one transaction.
 *
 * Open one store per database file per process and run the application's own writes on
 * `store.database`: better-sqlite3 waits for a lock synchronously, so a second connection in this
 * process would block the event loop that the first one's open transaction needs to finish.
 *
 * @example
 * ```ts
 * import { sqliteStore } from 'retrysafe/sqlite';
 * const store = sqliteStore({ filename: 'app.db' });
 * const result = await store.atomic(input, async (db) => {
 *   db.prepare('INSERT INTO loan (member, isbn) VALUES (?, ?)').run(member, isbn);
 *   return { response, commit: true };
 * });
 * ```
 */
export function sqliteStore<D extends SqliteDatabase>(
  options: SqliteStoreOptions<D> & { database: D },
): SqliteStore<D>;
export function sqliteStore(
  options: SqliteStoreOptions & { filename: string; driver: 'node:sqlite' },
): SqliteStore<NodeSqliteDatabase>;
export function sqliteStore(
  options: SqliteStoreOptions & { filename: string; driver: 'better-sqlite3' },
): SqliteStore<Database.Database>;
export function sqliteStore(options: SqliteStoreOptions): SqliteStore;
export function sqliteStore(given: SqliteStoreOptions): SqliteStore {
  const options = checkOptions('sqliteStore()', given, OPTION_NAMES);
  const { filename, database, driver: driverName } = options;
  if ((filename === undefined) === (database === undefined)) {
    throw new ConfigError('sqliteStore: give exactly one of `filename` or `database`');
  }
  if (filename !== undefined && (typeof filename !== 'string' || filename === '')) {
    throw new ConfigError('sqliteStore: `filename` must be a non-empty string');
  }
  if (driverName !== undefined && driverName !== 'better-sqlite3' && driverName !== 'node:sqlite') {
    throw new ConfigError(
      `sqliteStore: \`driver\` must be 'better-sqlite3' or 'node:sqlite', got ${JSON.stringify(driverName)}`,
    );
  }
  if (driverName !== undefined && database !== undefined) {
    throw new ConfigError('sqliteStore: `driver` is for `filename`; a `database` brings its own');
  }
  const table = tableName(options.table ?? 'idempotency_keys');
  const busyTimeoutMs = requirePositiveInteger('sqliteStore', 'busyTimeoutMs', options.busyTimeoutMs ?? 5000);
  const pollIntervalMs = requirePositiveInteger(
    'sqliteStore',
    'pollIntervalMs',
    options.pollIntervalMs ?? 10,
  );
  const maxPollIntervalMs = requirePositiveInteger(
    'sqliteStore',
    'maxPollIntervalMs',
    options.maxPollIntervalMs ?? 250,
  );
  const now = options.now ?? Date.now;
  if (typeof now !== 'function') throw new ConfigError('sqliteStore: `now` must be a function');
  if (maxPollIntervalMs < pollIntervalMs) {
    throw new ConfigError('sqliteStore: `maxPollIntervalMs` must not be less than `pollIntervalMs`');
  }

  const ownsDatabase = database === undefined;
  const handle = database ?? openDatabase(filename!, driverName, timerMs(busyTimeoutMs));
  const db: Driver = driverOf(handle);
  if (ownsDatabase) {
    db.exec('PRAGMA journal_mode = WAL');
  } else if (options.busyTimeoutMs !== undefined) {
    db.exec(`PRAGMA busy_timeout = ${timerMs(busyTimeoutMs)}`);
  }
  const configuredBusyMs = Object.values(db.prepare('PRAGMA busy_timeout').get() as object)[0] as number;

  const t = `"${table}"`;
  db.exec(sqliteMigrationSql({ table }).join(';\n'));
  addStepColumns(db, table);

  const sql = sqliteStatements(t);
  const claimStatement = db.prepare(sql.CLAIM);
  const selectRecord = db.prepare(sql.RECORD);
  const selectOwner = db.prepare(sql.OWNER);
  const selectLeaseLeft = db.prepare(sql.LEASE_LEFT);
  const completeStatement = db.prepare(sql.COMPLETE);
  const saveStepStatement = db.prepare(sql.SAVE_STEP);
  const abandonedStatement = db.prepare(sql.ABANDONED);
  const releaseStatement = db.prepare(sql.RELEASE);
  const renewStatement = db.prepare(sql.RENEW);
  const purgeStatement = db.prepare(sql.PURGE);
  const selectSummary = db.prepare(sql.GET);
  const selectWithResponse = db.prepare(sql.GET_WITH_RESPONSE);
  const deleteStatement = db.prepare(sql.DELETE);
  const listStatements = new Map<string, Statement>();
  function listStatement(byScope: boolean, after: 'none' | 'key' | 'row') {
    const shape = `${byScope}:${after}`;
    let statement = listStatements.get(shape);
    if (!statement) {
      statement = db.prepare(sql.list(byScope, after));
      listStatements.set(shape, statement);
    }
    return statement;
  }

  // Run inside a write transaction: the insert and the read of the row it collided with then see
  // one state even across processes.
  function claimIn(input: ClaimInput): ClaimResult {
    const nowMs = now();
    const token = newToken();
    const inserted = claimStatement.get(...claimParameters(input, token, nowMs)) as
      | { token: string; steps: string | null }
      | undefined;
    return (
      acquiredOf(inserted, token) ??
      settledOf(selectRecord.get(input.scope, input.key) as RecordRow, input, nowMs)
    );
  }

  /** `fn` in a savepoint of the transaction open on the connection (the application's own). */
  function inSavepoint<T>(fn: () => T): T {
    const savepoint = `retrysafe_${++savepoints}`;
    db.exec(`SAVEPOINT ${savepoint}`);
    try {
      const value = fn();
      db.exec(`RELEASE ${savepoint}`);
      return value;
    } catch (error) {
      if (db.inTransaction()) db.exec(`ROLLBACK TO ${savepoint}; RELEASE ${savepoint}`);
      throw error;
    }
  }

  // A completed record never changes until it expires, so answering a retry of it needs no write
  // lock. Only outside a transaction: inside one, the read could see a record not committed yet.
  function completedNow(input: ClaimInput): Settled | undefined {
    if (db.inTransaction()) return undefined;
    return completedOf(selectRecord.get(input.scope, input.key) as RecordRow | undefined, input, now());
  }

  /** When a call taking the write lock gives up on it: after the busy timeout or `timeoutMs`. */
  const lockDeadlineMs = (timeoutMs?: number) =>
    Date.now() + Math.min(configuredBusyMs, timeoutMs ?? Number.POSITIVE_INFINITY);

  /**
   * Runs `attempt`, which takes the write lock without waiting for it, again on `SQLITE_BUSY` until
   * `deadlineMs`. The wait is ours, not the driver's: SQLite's busy handler sleeps synchronously,
   * stalling every request of this process (reads included) behind one that waits for another
   * process's lock.
   */
  function whenUnlocked<T>(deadlineMs: number, attempt: () => T): T | Promise<T> {
    try {
      return attempt();
    } catch (error) {
      if (!isBusy(error, deadlineMs)) throw error;
    }
    // Only a lock held by another process costs a promise; a free one is taken in this turn.
    return retryUnlocked(deadlineMs, attempt);
  }

  async function retryUnlocked<T>(deadlineMs: number, attempt: () => T): Promise<T> {
    for (let pauseMs = 1; ; pauseMs = Math.min(pauseMs * 2, MAX_LOCK_RETRY_MS)) {
      await sleep(timerMs(Math.max(1, Math.min(pauseMs, deadlineMs - Date.now()))));
      try {
        return attempt();
      } catch (error) {
        if (!isBusy(error, deadlineMs)) throw error;
      }
    }
  }

  const isBusy = (error: unknown, deadlineMs: number) => isBusyError(error) && Date.now() < deadlineMs;

  // SQLite applies busy_timeout when it prepares the PRAGMA, so neither can be a cached statement;
  // one exec with the BEGIN costs one call instead of three.
  const restoreBusy = `PRAGMA busy_timeout = ${configuredBusyMs}`;
  const beginUnlocked = `PRAGMA busy_timeout = 0; BEGIN IMMEDIATE; ${restoreBusy}`;

  // Cached: preparing COMMIT per request cost more than running it.
  const commitStatement = db.prepare('COMMIT');
  const rollbackStatement = db.prepare('ROLLBACK');

  /** `BEGIN IMMEDIATE` without SQLite's synchronous wait for the lock (for {@link whenUnlocked}). */
  function beginImmediate(): void {
    try {
      db.exec(beginUnlocked);
    } catch (error) {
      db.exec(restoreBusy);
      throw error;
    }
  }

  /** Runs `fn` without SQLite's synchronous wait for the lock (for {@link whenUnlocked}). */
  function withoutBusyWait<T>(fn: () => T): () => T {
    return () => {
      db.exec('PRAGMA busy_timeout = 0');
      try {
        return fn();
      } finally {
        db.exec(restoreBusy);
      }
    };
  }

  /** `fn` in a write transaction of its own, taken once the lock is free. */
  async function inOwnTransaction<T>(deadlineMs: number, fn: () => T): Promise<T> {
    const unlocked = whenUnlocked(deadlineMs, beginImmediate);
    if (unlocked) await unlocked;
    try {
      const value = fn();
      commitStatement.run();
      return value;
    } catch (error) {
      if (db.inTransaction()) rollbackStatement.run();
      throw error;
    }
  }

  function saveStepNow(
    scope: string,
    key: string,
    token: string,
    step: SavedStep,
    request?: string,
  ): boolean {
    const { changes } = saveStepStatement.run(
      step.name,
      step.value,
      request ?? null,
      scope,
      key,
      token,
      now(),
    );
    return changes === 1;
  }

  function completeNow(scope: string, key: string, token: string, response: StoredResponse): boolean {
    const nowMs = now();
    const { changes } = completeStatement.run(
      nowMs,
      response.status,
      JSON.stringify(response.headers),
      response.body,
      scope,
      key,
      token,
      nowMs,
    );
    return changes === 1;
  }

  const root = new SerialQueue();
  const frames = new AsyncLocalStorage<Frame>();
  const waiters = new Waiters();
  /** Records whose atomic transaction is queued or open in this process. */
  const holding = new Set<string>();
  let savepoints = 0;
  let openFrames = 0;
  let closed = false;

  /**
   * Ends a transaction's frame. With none open, `frames` is disabled until the next transaction:
   * on Node 20 an AsyncLocalStorage in use runs async hooks on every promise and native handle of
   * the process: about 3 µs of CPU per loan desk request, replays and GETs included, measured in
   * process.
   * Code still holding a closed frame then reads none, which `exclusive` treats alike.
   */
  function closeFrame(frame: Frame): void {
    if (!frame.open) return;
    frame.open = false;
    if (--openFrames === 0) frames.disable();
  }

  // While a transaction is open on the connection, any statement run on it joins that
  // transaction; so every write of this store goes through the queue of the innermost open one.
  function exclusive<T>(fn: () => T | Promise<T>): Promise<T> {
    const frame = frames.getStore();
    return (frame?.open ? frame.queue : root).run(fn);
  }

  function runTransaction<T>(
    fn: (db: SqliteDatabase) => Promise<{ value: T; commit: boolean }>,
    timeoutMs?: number,
  ): Promise<T> {
    const nested = frames.getStore()?.open === true;
    const deadlineMs = lockDeadlineMs(timeoutMs);
    return exclusive(async () => {
      const savepoint = nested ? `retrysafe_${++savepoints}` : undefined;
      const end = (commit: boolean) => {
        if (!savepoint) (commit ? commitStatement : rollbackStatement).run();
        else db.exec(commit ? `RELEASE ${savepoint}` : `ROLLBACK TO ${savepoint}; RELEASE ${savepoint}`);
      };
      if (savepoint) db.exec(`SAVEPOINT ${savepoint}`);
      else {
        const unlocked = whenUnlocked(deadlineMs, beginImmediate);
        if (unlocked) await unlocked;
      }
      const frame: Frame = { open: true, queue: new SerialQueue() };
      openFrames++;
      try {
        const { value, commit } = await frames.run(frame, () => fn(handle));
        // Operations the work started but did not await still belong to this transaction.
        if (!frame.queue.idle) await frame.queue.run(() => undefined);
        closeFrame(frame);
        end(commit);
        return value;
      } catch (error) {
        closeFrame(frame);
        // SQLite rolls back by itself on some errors; a second ROLLBACK would mask the first error.
        if (db.inTransaction()) end(false);
        throw error;
      }
    });
  }

  function transaction<T>(fn: (db: SqliteDatabase) => T | Promise<T>): Promise<T> {
    return runTransaction(async (connection) => ({ value: await fn(connection), commit: true }));
  }

  async function atomic(
    input: ClaimInput,
    work: (tx: SqliteDatabase) => Promise<AtomicWorkResult>,
  ): Promise<AtomicResult> {
    const completed = completedNow(input);
    if (completed) return completed;
    const id = recordId(input.scope, input.key);
    // A duplicate would otherwise queue behind the original's transaction for as long as its
    // handler runs, past `wait` and `concurrency: 'reject'`; it is in progress, and says so now.
    if (holding.has(id)) return { outcome: 'in_progress', retryAfterMs: input.leaseMs };
    holding.add(id);
    // An atomic claim's lease is its retention: no other process sees it before it commits with
    // its answer, unless a handler committed it early, and such a record must never be taken over.
    const claim = { ...input, leaseMs: Math.max(input.leaseMs, input.retainMs) };
    let token: string | undefined;
    try {
      return await runTransaction<AtomicResult>(async (connection) => {
        const claimed = claimIn(claim);
        if (claimed.outcome !== 'acquired') return { value: claimed, commit: false };
        token = claimed.token;
        // A handler's own COMMIT (or ROLLBACK) ends the connection's transaction under us.
        const ended = () => !db.inTransaction();
        let result: AtomicWorkResult;
        try {
          result = await work(connection);
        } catch (error) {
          if (ended()) throw new Ended(error);
          throw error;
        }
        if (ended()) throw new Ended(undefined);
        const { response, commit } = result;
        if (commit && !completeNow(input.scope, input.key, claimed.token, response)) {
          // Only possible when the work outlived the record's retention: keep nothing.
          throw new RetrysafeError('sqliteStore.atomic: the record expired while the work ran; rolled back');
        }
        return { value: { outcome: 'executed', response, committed: commit }, commit };
      }, input.timeoutMs);
    } catch (error) {
      if (!(error instanceof Ended) || token === undefined) throw error;
      // The claim committed with the handler's writes: keep an answer on it so no retry runs them again.
      await complete(input.scope, input.key, token, TRANSACTION_ENDED_RESPONSE).catch(() => false);
      throw transactionEnded('sqliteStore', input.key, error.cause);
    } finally {
      holding.delete(id);
      waiters.wake(id);
    }
  }

  function claim(input: ClaimInput): Promise<ClaimResult> {
    const completed = completedNow(input);
    if (completed) return Promise.resolve(completed);
    const deadlineMs = lockDeadlineMs(input.timeoutMs);
    return exclusive(() =>
      db.inTransaction()
        ? whenUnlocked(
            deadlineMs,
            withoutBusyWait(() => inSavepoint(() => claimIn(input))),
          )
        : inOwnTransaction(deadlineMs, () => claimIn(input)),
    );
  }

  async function complete(scope: string, key: string, token: string, response: StoredResponse) {
    const done = await exclusive(() => completeNow(scope, key, token, response));
    if (done) waiters.wake(recordId(scope, key));
    return done;
  }

  function saveStep(scope: string, key: string, token: string, step: SavedStep, request?: string) {
    return exclusive(() => saveStepNow(scope, key, token, step, request));
  }

  // BEGIN IMMEDIATE holds SQLite's write lock from the fence check to the commit: a takeover's
  // claim (a write) waits for it, and no other process can take the key over in between.
  function phase(
    scope: string,
    key: string,
    token: string,
    work: (tx: SqliteDatabase) => Promise<SavedStep>,
    request?: string,
  ): Promise<boolean> {
    return runTransaction(async (connection) => {
      const owner = selectOwner.get(scope, key, now()) as { token: string } | undefined;
      if (owner?.token !== token) return { value: false, commit: false };
      const step = await work(connection);
      return { value: saveStepNow(scope, key, token, step, request), commit: true };
    });
  }

  async function abandoned(options: AbandonedOptions = {}): Promise<AbandonedRecord[]> {
    const limit = abandonedLimit('sqliteStore.abandoned', options);
    const nowMs = now();
    return (abandonedStatement.all(nowMs, nowMs, limit) as AbandonedRow[]).map(abandonedOf);
  }

  async function release(scope: string, key: string, token: string) {
    const done = await exclusive(() => releaseStatement.run(scope, key, token, now()).changes === 1);
    if (done) waiters.wake(recordId(scope, key));
    return done;
  }

  // Like a claim, a renewal waits for another process's lock without stalling the event loop.
  function renew(scope: string, key: string, token: string, leaseMs: number) {
    const deadlineMs = lockDeadlineMs();
    return exclusive(() =>
      whenUnlocked(
        deadlineMs,
        withoutBusyWait(() => {
          const nowMs = now();
          const leaseUntilMs = nowMs + leaseMs;
          return renewStatement.run(leaseUntilMs, leaseUntilMs, scope, key, token, nowMs).changes === 1;
        }),
      ),
    );
  }

  async function wait(scope: string, key: string, timeoutMs: number) {
    const id = recordId(scope, key);
    const polls = { firstPollMs: pollIntervalMs, maxPollMs: maxPollIntervalMs };
    await pollUntilSettled(
      waiters,
      id,
      timeoutMs,
      async () => {
        if (closed) return null;
        // An atomic original of this process may still be queued: no row yet, but in progress.
        if (holding.has(id)) return Number.POSITIVE_INFINITY;
        const nowMs = now();
        const row = selectLeaseLeft.get(nowMs, scope, key, nowMs, nowMs) as
          | { lease_left_ms: number }
          | undefined;
        return row ? row.lease_left_ms : null;
      },
      polls,
    );
  }

  async function purgeExpired(batchSize = SQLITE_PURGE_BATCH_SIZE) {
    requirePositiveInteger('sqliteStore.purgeExpired', 'batchSize', batchSize);
    const checkpointer = walCheckpointer(db);
    try {
      // A batch holds the event loop and the write lock: the rests leave requests half of both.
      const deleteBatch = pacedDeletes(
        SQLITE_PURGE_STATEMENT_MS,
        async (limit) => (await exclusive(() => purgeStatement.run(now(), limit))).changes,
      );
      return await purgeInBatches(
        batchSize,
        () => deleteBatch(batchSize),
        checkpointer ? (ms) => Promise.all([sleep(ms), checkpointer.checkpoint()]) : undefined,
      );
    } finally {
      await checkpointer?.close();
    }
  }

  async function list(options: ListKeysOptions = {}): Promise<KeyPage> {
    const { limit, scope, after } = listRequest('sqliteStore.list', options, 2);
    const shape = listShape(scope, after);
    const rows = listStatement(scope !== undefined, shape).all(
      ...listParameters(now(), limit, scope, shape, after),
    ) as SummaryRow[];
    return keysetPage(rows.map(summaryOf), limit);
  }

  async function get(scope: string, key: string, options?: GetKeyOptions) {
    const statement = options?.response ? selectWithResponse : selectSummary;
    const row = statement.get(scope, key, now()) as (SummaryRow & ResponseRow) | undefined;
    return row && keyRecordOf(summaryOf(row), row, options);
  }

  async function deleteRecord(scope: string, key: string) {
    const done = await exclusive(() => deleteStatement.run(scope, key, now()).changes === 1);
    if (done) waiters.wake(recordId(scope, key));
    return done;
  }

  async function close() {
    if (closed) return;
    closed = true;
    waiters.wakeAll();
    await root.run(() => undefined);
    if (ownsDatabase) db.close();
  }

  return {
    name: 'sqlite',
    database: handle,
    driver: db.name,
    claim,
    complete,
    release,
    saveStep,
    phase,
    abandoned,
    renew,
    wait,
    purgeExpired,
    list,
    get,
    delete: deleteRecord,
    close,
    atomic,
    transaction,
  };
}
