import { setTimeout as sleep } from 'node:timers/promises';
import type Database from 'better-sqlite3';
import { ConfigError } from '../../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../../core/options/index.js';
import type { AtomicStore, PhaseStore } from '../../core/store.js';
import { pacedDeletes, purgeInBatches, requirePositiveInteger } from '../internal.js';
import { sqlStore } from '../sql/store.js';
import { walCheckpointer } from './checkpoint.js';
import {
  driverOf,
  type NodeSqliteDatabase,
  openDatabase,
  type SqliteDatabase,
  type SqliteDriverName,
} from './driver.js';
import { tableName } from './migrate.js';
import { sqliteDriver } from './sql-driver.js';
import { sqliteStatements } from './statements.js';

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
   * The database file to open (created if missing), or `:memory:`. Give this or `database`, not
   * both. Opened in WAL with `synchronous = NORMAL` on either driver (better-sqlite3's own
   * default): a commit survives a crash of the process; an OS crash or a power cut may roll back
   * the last commits (SQLite syncs the WAL at each checkpoint). For `FULL`, pass a `database`.
   * @default undefined
   * @example url: 'app.db'
   */
  url?: string;
  /**
   * An open connection to use instead, e.g. the one holding the application's own tables (atomic
   * mode needs that): a better-sqlite3 `Database` or a node:sqlite `DatabaseSync` (Node ≥ 22.16).
   * It is used as configured and `close()` leaves it open.
   * @default undefined
   * @example database: new Database('library.db')
   */
  database?: D;
  /**
   * The SQLite binding that opens `url`: better-sqlite3 (a native addon), or Node's own
   * node:sqlite (Node ≥ 22.16, nothing to install or rebuild). By default better-sqlite3 where it
   * is installed, node:sqlite where it is not. With `database`, the connection's own.
   * @default 'better-sqlite3' if installed, else 'node:sqlite'
   * @example driver: 'node:sqlite'
   */
  driver?: SqliteDriverName;
  /**
   * The table holding the records.
   * @default 'idempotency_keys'
   * @example table: 'loan_keys'
   */
  table?: string;
  /**
   * Create the table (and its indexes) on first use when missing. Off by default: the table is
   * then made by `store.migrate()`, `retrysafe migrate`, or your migration tool with the SQL of
   * `retrysafe migrate --print`; a store without it fails every call with a `ConfigError` saying so.
   * @default false
   */
  migrate?: boolean;
  /**
   * How long a write waits for another process's write lock before failing with `SQLITE_BUSY`
   * (counted from the call, time queued behind this process's own transactions included). The
   * store's own transactions and writes wait without blocking the event loop; any other statement
   * on the connection waits synchronously, as better-sqlite3 does.
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
  /** Creates the table and its indexes when missing; safe to run again. */
  migrate(): Promise<void>;
  /**
   * Runs `fn` in `BEGIN IMMEDIATE` … `COMMIT` (`ROLLBACK` if it throws) on {@link SqliteStore.database}.
   * An async `fn` may await while the transaction is open: every other write of this store in this
   * process queues until it ends, instead of silently joining it. Called inside another transaction
   * of this store (or inside `atomic`'s work) it becomes a savepoint. Transactions queued together
   * commit together (group commit, each in a savepoint): the returned promise settles only after
   * that COMMIT, and a `fn` that throws rolls back only its own writes.
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

const OPTION_NAMES = optionNames<SqliteStoreOptions>({
  url: true,
  database: true,
  migrate: true,
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
 * const store = sqliteStore({ url: 'app.db', migrate: true });
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
  options: SqliteStoreOptions & { url: string; driver: 'node:sqlite' },
): SqliteStore<NodeSqliteDatabase>;
export function sqliteStore(
  options: SqliteStoreOptions & { url: string; driver: 'better-sqlite3' },
): SqliteStore<Database.Database>;
export function sqliteStore(options: SqliteStoreOptions): SqliteStore;
export function sqliteStore(given: SqliteStoreOptions): SqliteStore {
  const options = checkOptions('sqliteStore()', given, OPTION_NAMES);
  const { url, database, driver: driverName } = options;
  if ((url === undefined) === (database === undefined)) {
    throw new ConfigError('sqliteStore: give exactly one of `url` or `database`');
  }
  if (url !== undefined && (typeof url !== 'string' || url === '')) {
    throw new ConfigError('sqliteStore: `url` must be a non-empty string (a file path or `:memory:`)');
  }
  if (driverName !== undefined && driverName !== 'better-sqlite3' && driverName !== 'node:sqlite') {
    throw new ConfigError(
      `sqliteStore: \`driver\` must be 'better-sqlite3' or 'node:sqlite', got ${JSON.stringify(driverName)}`,
    );
  }
  if (driverName !== undefined && database !== undefined) {
    throw new ConfigError('sqliteStore: `driver` is for `url`; a `database` brings its own');
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
  const handle = database ?? openDatabase(url!, driverName, timerMs(busyTimeoutMs));
  const connection = driverOf(handle);
  if (ownsDatabase) {
    // better-sqlite3 is built with SQLITE_DEFAULT_WAL_SYNCHRONOUS=1 and node:sqlite with SQLite's
    // own default, FULL: an fsync per commit, which was most of node:sqlite's gap to better-sqlite3.
    // One setting for both drivers (see `url`).
    connection.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL');
  } else if (options.busyTimeoutMs !== undefined) {
    connection.exec(`PRAGMA busy_timeout = ${timerMs(busyTimeoutMs)}`);
  }

  const driver = sqliteDriver(handle, {
    now,
    pollDelays: { firstPollMs: pollIntervalMs, maxPollMs: maxPollIntervalMs },
  });
  const store = sqlStore(driver, { table, migrate: options.migrate });
  const purge = sqliteStatements(`"${table}"`).PURGE;

  async function purgeExpired(batchSize = SQLITE_PURGE_BATCH_SIZE) {
    requirePositiveInteger('sqliteStore.purgeExpired', 'batchSize', batchSize);
    const checkpointer = walCheckpointer(connection);
    try {
      // A read through the store's own checks first: a missing table is its ConfigError (or made).
      await store.get('', '');
      // A batch holds the event loop and the write lock: the rests leave requests half of both.
      const deleteBatch = pacedDeletes(
        SQLITE_PURGE_STATEMENT_MS,
        async (limit) => (await driver.query(purge, [now(), limit])).affected,
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

  let closed = false;
  return {
    ...store,
    name: 'sqlite',
    database: handle,
    driver: driver.binding,
    purgeExpired,
    transaction: (fn) => driver.transaction(async (db) => fn(db)),
    async close() {
      if (closed) return;
      closed = true;
      await store.close();
      // The transactions queued or open on the connection end first.
      await driver.close(ownsDatabase);
    },
  };
}
