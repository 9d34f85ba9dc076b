/** The SQL a driver speaks: a SQL store picks its statements by it. */
export type SqlDialect = 'postgres' | 'mysql' | 'sqlite';

/** What one statement gave back: its rows (a SELECT, a RETURNING) and how many rows it changed. */
export interface SqlResult<Row = Record<string, unknown>> {
  rows: Row[];
  /** Rows inserted, updated or deleted; 0 for a SELECT. */
  affected: number;
  /**
   * MySQL's `LAST_INSERT_ID()` after the statement, where the driver reports it (mysql2 does): a
   * claim's says whether it inserted its row, sparing the read back.
   */
  insertId?: number;
}

/** A client-side bound on one of the store's statements. */
export interface StatementBound {
  timeoutMs: number;
}

/** What the store asks of a transaction beyond running it, where the driver can honour it. */
export interface TransactionOptions {
  /**
   * How long getting a connection for it may take before `transaction()` rejects (running
   * nothing), so a starved pool fails the call within the store's timeout instead of queueing it.
   */
  acquireTimeoutMs?: number;
}

/**
 * The seam between a SQL store's statements and whatever runs them: an ORM (Prisma, Drizzle,
 * Kysely, Knex, TypeORM) or a plain client. A driver is a few dozen lines; the store's SQL, its
 * claim loop, fencing and atomic mode live once, in the store.
 *
 * Statements come in the dialect's own placeholders (`$1` in PostgreSQL, `?` in MySQL and SQLite);
 * each parameter is a string, a number, `null` or a `Uint8Array`. Row values may come back as the
 * driver decodes them (a PostgreSQL `bigint` as a string, a `json` column parsed or not): the store
 * normalises them.
 *
 * `Tx` is the application's own transaction object, handed to handlers as `ctx.tx`: Drizzle's `tx`,
 * Kysely's `Transaction`, Knex's `trx`, TypeORM's `EntityManager`, Prisma's interactive transaction
 * client. A `transaction()` the handler opens on it nests the ORM's own way (a savepoint).
 */
export interface SqlDriver<Tx> {
  readonly dialect: SqlDialect;
  /** A short name for errors and logs: `drizzle`, `kysely`, `pg`. */
  readonly name: string;
  /** Runs one statement on its own, outside any transaction of the caller (autocommit). */
  query<Row = Record<string, unknown>>(sql: string, params: readonly unknown[]): Promise<SqlResult<Row>>;
  /**
   * Opens a transaction the application's way and runs `work` in it: commits when `work`
   * resolves, rolls back when it throws, and rethrows what it threw.
   */
  transaction<T>(work: (tx: Tx) => Promise<T>, options?: TransactionOptions): Promise<T>;
  /**
   * Runs one statement inside `tx`, a transaction `transaction()` opened. A driver that can bound
   * it client side honours `bound.timeoutMs` (the store's own statements only, never a handler's):
   * past it the statement fails and the transaction's connection is discarded, not reused.
   */
  queryIn<Row = Record<string, unknown>>(
    tx: Tx,
    sql: string,
    params: readonly unknown[],
    bound?: StatementBound,
  ): Promise<SqlResult<Row>>;
  /**
   * The database's own code for `error` (PostgreSQL's SQLSTATE such as `55P03`, MySQL's such as
   * `ER_LOCK_WAIT_TIMEOUT`, SQLite's such as `SQLITE_BUSY`), however the driver wrapped it; `undefined`
   * when it carries none (a network error).
   */
  errorCode(error: unknown): string | undefined;
  /**
   * SQLite: the clock records are stamped and judged by, in ms since the epoch (the database runs
   * in this process and has no clock of its own in ms). Absent: `Date.now`.
   */
  now?(): number;
  /**
   * How often a wait reads the record: first after `firstPollMs`, doubled up to `maxPollMs` (the
   * SQLite store's `pollIntervalMs` and `maxPollIntervalMs`). Absent: the stores' defaults.
   */
  readonly pollDelays?: { firstPollMs: number; maxPollMs: number };
}

/**
 * The database code of an error a driver may have wrapped: the first `code` (SQLSTATE or errno)
 * found on it, its `cause` chain, or the places ORMs keep the original (`originalCode`,
 * `driverError`).
 */
export function databaseErrorCode(error: unknown): string | undefined {
  const seen = new Set<unknown>();
  let current: unknown = error;
  while (current && typeof current === 'object' && !seen.has(current)) {
    seen.add(current);
    const found = current as {
      code?: unknown;
      originalCode?: unknown;
      driverError?: unknown;
      cause?: unknown;
    };
    if (typeof found.originalCode === 'string') return found.originalCode;
    if (typeof found.code === 'string' && /^[0-9A-Z]{5}$|^SQLITE_|^ER_/.test(found.code)) return found.code;
    current = found.driverError ?? found.cause;
  }
  return undefined;
}
