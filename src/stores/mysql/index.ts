import { randomUUID } from 'node:crypto';
import mysql, {
  type Pool,
  type PoolConnection,
  type QueryValues,
  type ResultSetHeader,
  type RowDataPacket,
} from 'mysql2/promise';
import {
  type AtomicResult,
  type AtomicStore,
  type AtomicWorkResult,
  type ClaimInput,
  type ClaimResult,
  ConfigError,
  type PhaseStore,
  RetrysafeError,
  type SavedStep,
  type StoredResponse,
} from '../../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../../core/options/index.js';
import { atomicInFlight, BLOCKED_RETRY_AFTER_MS } from '../in-flight.js';
import {
  type AbandonedRow,
  abandonedLimit,
  abandonedOf,
  DEFAULT_PURGE_BATCH_SIZE,
  keyRecordOf,
  keysetPage,
  listRequest,
  purgeInBatches,
  type ResponseRow,
  recordId,
  requirePositiveInteger,
  type SummaryRow,
  summaryOf,
  toBuffer,
  Waiters,
} from '../internal.js';
import { pollUntilSettled } from '../poll-wait.js';
import { Ended, TRANSACTION_ENDED_RESPONSE, transactionEnded } from '../transaction-ended.js';
import { identifier, mysqlMigrationSql } from './migrate.js';
import { claimOfRecord, claimValues, type RecordRow, statements } from './statements.js';

export { mysqlMigrationSql };

/** Options of {@link mysqlStore}: one of `pool` or `uri`. */
export interface MysqlStoreOptions {
  /**
   * A `mysql2/promise` pool to use; the store never ends it. One of `pool`/`uri`.
   * @default undefined
   * @example pool: mysql.createPool({ uri: process.env.DATABASE_URL })
   */
  pool?: Pool;
  /**
   * A `mysql://` URL naming the database; the store then owns a pool built from it.
   * @default undefined
   * @example uri: 'mysql://app@127.0.0.1:3306/app'
   */
  uri?: string;
  /**
   * The table holding the records, in the connection's database.
   * @default 'idempotency_keys'
   */
  table?: string;
  /**
   * Connections of the store's own pool.
   * @default 10
   */
  maxConnections?: number;
  /**
   * How long opening a connection of the store's own pool may take before the call rejects, so
   * an unreachable database fails fast instead of hanging a request.
   * @default 5000
   */
  connectTimeoutMs?: number;
  /**
   * Create the table on first use when it is missing, as `migrate()` does. Off by default: the
   * table is then made by `retrysafe migrate` (or your migration tool, from `retrysafe migrate
   * --print`), and a store without it fails every call with a `ConfigError` saying so.
   * @default false
   */
  migrate?: boolean;
}

/** The MySQL/MariaDB store: lease mode through the `IdempotencyStore` methods, atomic mode through `atomic`. */
export interface MysqlStore extends AtomicStore<PoolConnection>, PhaseStore<PoolConnection> {
  /**
   * Creates the table and its indexes when missing, and adds the step columns to a table made by
   * an older release (the statements of `mysqlMigrationSql`); safe to run again.
   */
  migrate(): Promise<void>;
  /** The pool the store queries; handlers in atomic mode get a connection of it as `tx`. */
  readonly pool: Pool;
}

/**
 * A claim that finds the record changing under it (released, purged or taken over between its
 * write and its read, or a deadlock InnoDB broke) asks again; a few rounds settle any realistic
 * interleaving.
 */
const CLAIM_ATTEMPTS = 4;
/** How long an atomic claim may take, pool wait included, when the caller gives no `timeoutMs`. */
const DEFAULT_ATOMIC_TIMEOUT_MS = 15_000;
const QUERY_TIMEOUT = 'PROTOCOL_SEQUENCE_TIMEOUT';
const ER_NO_SUCH_TABLE = 'ER_NO_SUCH_TABLE';
const ER_LOCK_WAIT_TIMEOUT = 'ER_LOCK_WAIT_TIMEOUT';
const ER_LOCK_DEADLOCK = 'ER_LOCK_DEADLOCK';
/** A table made before steps existed: `migrate` adds their columns. */
const ER_BAD_FIELD_ERROR = 'ER_BAD_FIELD_ERROR';

interface MysqlAbandonedRow extends RowDataPacket, Omit<AbandonedRow, 'scope' | 'key'> {
  scope: Buffer;
  key: Buffer;
}

interface MysqlSummaryRow extends RowDataPacket, Omit<SummaryRow, 'scope' | 'key' | 'steps'> {
  scope: Buffer;
  key: Buffer;
  steps: string | null;
}

const OPTION_NAMES = optionNames<MysqlStoreOptions>({
  pool: true,
  uri: true,
  table: true,
  maxConnections: true,
  connectTimeoutMs: true,
  migrate: true,
});

/** Something statements run on: the pool (lease mode) or the atomic call's connection. */
type Queryable = Pick<Pool, 'query'>;

/**
 * A store on MySQL 8 or MariaDB 10.6+ through `mysql2`, for several app servers or hosts sharing
 * one database. A claim is one `INSERT … ON DUPLICATE KEY UPDATE` on the `(scope, key)` primary
 * key whose update takes the record over only when its retention or (same fingerprint) its lease
 * has passed, so of concurrent claims exactly one writes its owner token; every time comes from
 * the database server's clock; waits poll with backoff (woken at once by changes made through
 * this store in this process). `atomic()` runs the claim, the handler's queries on `tx` and the
 * saved response in one InnoDB transaction: a crash leaves all of it or none of it, and a
 * concurrent duplicate blocks on the record's row lock until the first commits (then replays) or
 * rolls back (then runs).
 *
 * Create its table once before use: `migrate()`, `retrysafe migrate --database-url mysql://…`,
 * the SQL of `retrysafe migrate --print` in your own migration tool, or the `migrate: true`
 * option. Without it every call fails with a `ConfigError` that says so.
 *
 * @example
 * ```ts
 * import { mysqlStore } from 'retrysafe/mysql';
 * const store = mysqlStore({ uri: 'mysql://app@127.0.0.1:3306/app' });
 * await store.migrate();
 * ```
 */
export function mysqlStore(given: MysqlStoreOptions): MysqlStore {
  const options = checkOptions('mysqlStore()', given, OPTION_NAMES);
  if ((options.pool === undefined) === (options.uri === undefined)) {
    throw new ConfigError('mysqlStore: give exactly one of `pool` or `uri`');
  }
  const table = identifier('table', options.table ?? 'idempotency_keys');
  const maxConnections = requirePositiveInteger('mysqlStore', 'maxConnections', options.maxConnections ?? 10);
  const connectTimeoutMs = requirePositiveInteger(
    'mysqlStore',
    'connectTimeoutMs',
    options.connectTimeoutMs ?? 5000,
  );
  const ownsPool = options.pool === undefined;
  const pool =
    options.pool ??
    mysql.createPool({
      uri: options.uri,
      connectionLimit: maxConnections,
      connectTimeout: connectTimeoutMs,
      enableKeepAlive: true,
    });
  const t = `\`${table}\``;

  const sql = statements(t);

  async function run<T extends RowDataPacket[] | ResultSetHeader>(
    on: Queryable,
    text: string,
    values: { [name: string]: QueryValues },
    timeoutMs?: number,
  ): Promise<T> {
    const [result] = await on.query<T>({ sql: text, namedPlaceholders: true, timeout: timeoutMs }, values);
    return result;
  }

  const waiters = new Waiters();
  let migrating: Promise<void> | undefined;

  /** The statements share a session (a user variable, a prepared statement): one connection runs them all. */
  async function migrateOn(on: Queryable): Promise<void> {
    if (on === pool) {
      const connection = await pool.getConnection();
      try {
        await migrateOn(connection);
      } finally {
        connection.release();
      }
      return;
    }
    for (const statement of mysqlMigrationSql({ table })) await on.query(statement);
  }

  /**
   * Runs one of the store's own statements. A missing table fails it with a ConfigError that says
   * what to do, rather than a driver error behind a 503; with `migrate: true` the table is created
   * (once, however many calls find it missing) and the statement runs again. A call holding a
   * connection (`atomic`) migrates on it, so a one-connection pool cannot deadlock.
   */
  async function own<T>(statement: () => Promise<T>, on: Queryable = pool): Promise<T> {
    try {
      return await statement();
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code !== ER_NO_SUCH_TABLE && code !== ER_BAD_FIELD_ERROR) throw error;
      if (!options.migrate) {
        throw new ConfigError(
          `mysqlStore: the table ${t} ${code === ER_NO_SUCH_TABLE ? 'does not exist' : 'lacks the step columns of this release'}. Create it with \`retrysafe migrate --database-url <mysql://…> --table ${table}\` (or store.migrate(), or your migration tool with the SQL of \`retrysafe migrate --print --database-url mysql://…\`), or pass \`migrate: true\``,
          { cause: error },
        );
      }
      migrating ??= migrateOn(on).finally(() => {
        migrating = undefined;
      });
      await migrating;
      // DDL commits the transaction it runs in: a claim on a connection in one (atomic mode) starts
      // it again, empty, or it would run in autocommit, apart from the handler's writes.
      if (on !== pool) await (on as PoolConnection).beginTransaction();
      return statement();
    }
  }

  /**
   * One round of a claim on `on`: the claim statement, then (unless it took a record over, which
   * only a write of our token does) the row it met. `undefined`: the row changed between the two
   * (released, purged, its lease passed); ask again.
   */
  async function claimOnce(
    on: Queryable,
    input: ClaimInput,
    timeoutMs?: number,
  ): Promise<ClaimResult | undefined> {
    const token = randomUUID();
    const values = claimValues(input, token);
    const claimed = await run<ResultSetHeader>(on, sql.CLAIM, values, timeoutMs);
    if (claimed.insertId === 0) return { outcome: 'acquired', token };
    // Read back even after a takeover (2 rows affected): it answers the steps saved before it.
    const [row] = await run<(RecordRow & RowDataPacket)[]>(on, sql.RECORD, values, timeoutMs);
    return claimOfRecord(row, token, input);
  }

  async function claim(input: ClaimInput): Promise<ClaimResult> {
    for (let attempt = 1; attempt <= CLAIM_ATTEMPTS; attempt++) {
      try {
        const result = await own(() => claimOnce(pool, input));
        if (result) return result;
      } catch (error) {
        // Concurrent inserts of one new key can deadlock on its gap lock; InnoDB picks a victim.
        if ((error as { code?: string }).code !== ER_LOCK_DEADLOCK) throw error;
      }
    }
    return { outcome: 'in_progress', retryAfterMs: 0 };
  }

  /** The record `(scope, key)` changed: wake this process's waiters on it at once. */
  function changed(scope: string, key: string, result: ResultSetHeader): boolean {
    if (result.affectedRows === 0) return false;
    waiters.wake(recordId(scope, key));
    return true;
  }

  /**
   * A pool connection, or a rejection once `timeoutMs` has passed: mysql2's pool queues callers
   * without a bound, and an atomic call must fail within its store timeout, not hang. A connection
   * that comes after that goes straight back.
   */
  function connectionWithin(timeoutMs: number): Promise<PoolConnection> {
    const connecting = pool.getConnection();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        connecting.then((connection) => connection.release()).catch(() => {});
        reject(new RetrysafeError(`mysqlStore: no pool connection within ${timeoutMs} ms`));
      }, timerMs(timeoutMs));
    });
    return Promise.race([connecting, timedOut]).finally(() => clearTimeout(timer));
  }

  /**
   * Runs `work`'s transactions on a connection the store took from the pool, then gives it back.
   * A failure rolls the open transaction back; a connection that cannot be trusted any more (its
   * query timed out, `lent.broken`, or that rollback failed) is destroyed instead of returned.
   */
  async function inTransactionOn<T>(
    connection: PoolConnection,
    work: (lent: { broken: boolean }) => Promise<T>,
  ): Promise<T> {
    const lent = { broken: false };
    try {
      return await work(lent);
    } catch (error) {
      if (!lent.broken) {
        await connection.rollback().catch(() => {
          lent.broken = true;
        });
      }
      throw error;
    } finally {
      if (lent.broken) connection.destroy();
      else connection.release();
    }
  }

  async function complete(scope: string, key: string, token: string, response: StoredResponse) {
    return changed(
      scope,
      key,
      await own(() => run<ResultSetHeader>(pool, sql.COMPLETE, completeValues(scope, key, token, response))),
    );
  }

  async function atomicOnConnection(
    input: ClaimInput,
    work: (tx: PoolConnection) => Promise<AtomicWorkResult>,
  ): Promise<AtomicResult> {
    const timeoutMs = Math.max(1, input.timeoutMs ?? DEFAULT_ATOMIC_TIMEOUT_MS);
    const connection = await connectionWithin(timeoutMs);
    // An atomic claim's lease is its retention: no one sees it before it commits with its answer,
    // unless a handler committed it early, and such a record must never be taken over.
    const claim = { ...input, leaseMs: Math.max(input.leaseMs, input.retainMs) };
    let token: string | undefined;
    try {
      return await atomicIn(connection, claim, timeoutMs, work, (acquired) => {
        token = acquired;
      });
    } catch (error) {
      if (!(error instanceof Ended) || token === undefined) throw error;
      // The claim committed with the handler's writes: keep an answer on it so no retry runs them again.
      await complete(input.scope, input.key, token, TRANSACTION_ENDED_RESPONSE).catch(() => false);
      throw transactionEnded('mysqlStore', input.key, error.cause);
    }
  }

  /**
   * Whether the handler ended the transaction that claimed (a COMMIT of its own): MariaDB's
   * @@in_transaction is then 0. False when unsure, and on MySQL, which has no such variable.
   */
  async function endedOn(connection: PoolConnection): Promise<boolean> {
    try {
      const [rows] = await connection.query<RowDataPacket[]>(sql.ENDED);
      return Number(rows[0]?.open) === 0;
    } catch {
      return false;
    }
  }

  /** Until the server says it has no @@in_transaction (MySQL), completions in atomic mode check it. */
  let guardedCompletion = true;

  /** The atomic completion: MariaDB's changes nothing once the handler ended the transaction. */
  async function completeIn(connection: PoolConnection, values: ReturnType<typeof completeValues>) {
    if (guardedCompletion) {
      try {
        return await run<ResultSetHeader>(connection, sql.ATOMIC_COMPLETE, values);
      } catch (error) {
        // A failed statement does not end a MySQL transaction: the plain completion runs in it.
        if ((error as { code?: string }).code !== 'ER_UNKNOWN_SYSTEM_VARIABLE') throw error;
        guardedCompletion = false;
      }
    }
    return run<ResultSetHeader>(connection, sql.COMPLETE, values);
  }

  function atomicIn(
    connection: PoolConnection,
    input: ClaimInput,
    timeoutMs: number,
    work: (tx: PoolConnection) => Promise<AtomicWorkResult>,
    acquired: (token: string) => void,
  ): Promise<AtomicResult> {
    return inTransactionOn(connection, async (lent) => {
      const waitS = Math.max(1, Math.ceil((input.waitMs ?? input.leaseMs) / 1000));
      for (let attempt = 1; ; attempt++) {
        await run(connection, sql.BOUND_LOCK_WAIT, { seconds: waitS });
        await connection.beginTransaction();
        let claimed: ClaimResult | undefined;
        try {
          // The client-side bound, for what InnoDB's row-lock wait does not cover (a table lock,
          // a server that stopped answering): the connection is then discarded.
          claimed = await own(() => claimOnce(connection, input, timeoutMs + waitS * 1000), connection);
        } catch (error) {
          const code = (error as { code?: string }).code;
          if (code === ER_LOCK_WAIT_TIMEOUT) {
            claimed = { outcome: 'in_progress', retryAfterMs: BLOCKED_RETRY_AFTER_MS };
          } else if (code !== ER_LOCK_DEADLOCK) {
            if (code === QUERY_TIMEOUT) lent.broken = true;
            throw error;
          }
        } finally {
          if (!lent.broken) await connection.query(sql.UNBOUND_LOCK_WAIT);
        }
        if (!claimed && attempt === CLAIM_ATTEMPTS) claimed = { outcome: 'in_progress', retryAfterMs: 0 };
        if (claimed?.outcome === 'acquired') {
          acquired(claimed.token);
          let result: AtomicWorkResult;
          try {
            result = await work(connection);
          } catch (error) {
            if (await endedOn(connection)) throw new Ended(error);
            throw error;
          }
          if (!result.commit) {
            if (await endedOn(connection)) throw new Ended(undefined);
            await connection.rollback();
            return { outcome: 'executed', response: result.response, committed: false };
          }
          const saved = await completeIn(
            connection,
            completeValues(input.scope, input.key, claimed.token, result.response),
          );
          if (saved.affectedRows !== 1) {
            if (await endedOn(connection)) throw new Ended(undefined);
            throw new RetrysafeError('mysqlStore: the atomic claim was lost before commit');
          }
          await connection.commit();
          waiters.wake(recordId(input.scope, input.key));
          return { outcome: 'executed', response: result.response, committed: true };
        }
        await connection.rollback();
        if (claimed) return claimed;
      }
    });
  }

  function completeValues(scope: string, key: string, token: string, response: StoredResponse) {
    return {
      scope,
      key,
      token,
      status: response.status,
      headers: JSON.stringify(response.headers),
      body: toBuffer(response.body),
    };
  }

  function stepValues(scope: string, key: string, token: string, step: SavedStep, request?: string) {
    return {
      scope,
      key,
      token,
      step: JSON.stringify({ name: step.name, value: step.value }),
      request: request ?? null,
    };
  }

  /**
   * A phase on a connection of its own: the row lock (FOR UPDATE), the fence check, the work's
   * queries and the saved step commit together. An owner that dies inside it leaves an open
   * transaction the server rolls back when the connection goes; one whose key was taken over
   * finds another token under the lock and runs nothing.
   */
  async function phase(
    scope: string,
    key: string,
    token: string,
    work: (tx: PoolConnection) => Promise<SavedStep>,
    request?: string,
  ): Promise<boolean> {
    const connection = await pool.getConnection();
    return inTransactionOn(connection, async () => {
      await connection.beginTransaction();
      const [row] = await own(
        () => run<RowDataPacket[]>(connection, sql.LOCK_OWNED, { scope, key }),
        connection,
      );
      if (row?.token !== token) {
        await connection.rollback();
        return false;
      }
      const step = await work(connection);
      const saved = await run<ResultSetHeader>(
        connection,
        sql.SAVE_STEP,
        stepValues(scope, key, token, step, request),
      );
      await connection.commit();
      return saved.affectedRows === 1;
    });
  }

  const deduplicated = atomicInFlight();

  return {
    name: 'mysql',
    pool,

    migrate: () => migrateOn(pool),

    claim,

    complete,

    async release(scope, key, token) {
      return changed(
        scope,
        key,
        await own(() => run<ResultSetHeader>(pool, sql.RELEASE, { scope, key, token })),
      );
    },

    async saveStep(scope, key, token, step, request) {
      const values = stepValues(scope, key, token, step, request);
      const result = await own(() => run<ResultSetHeader>(pool, sql.SAVE_STEP, values));
      return result.affectedRows === 1;
    },

    phase,

    async abandoned(options = {}) {
      const limit = abandonedLimit('mysqlStore.abandoned', options);
      const rows = await own(() => run<MysqlAbandonedRow[]>(pool, sql.ABANDONED, { limit }));
      return rows.map((row) =>
        abandonedOf({ ...row, scope: row.scope.toString('utf8'), key: row.key.toString('utf8') }),
      );
    },

    async renew(scope, key, token, leaseMs) {
      const result = await own(() => run<ResultSetHeader>(pool, sql.RENEW, { scope, key, token, leaseMs }));
      return result.affectedRows === 1;
    },

    async wait(scope, key, timeoutMs) {
      await pollUntilSettled(waiters, recordId(scope, key), timeoutMs, async () => {
        const [row] = await own(() => run<RowDataPacket[]>(pool, sql.LEASE_LEFT, { scope, key }));
        return row ? Number(row.lease_left_ms) : null;
      });
    },

    async purgeExpired(batchSize = DEFAULT_PURGE_BATCH_SIZE) {
      requirePositiveInteger('mysqlStore.purgeExpired', 'batchSize', batchSize);
      return purgeInBatches(
        batchSize,
        async () => (await own(() => run<ResultSetHeader>(pool, sql.PURGE, { batchSize }))).affectedRows,
      );
    },

    async list(options = {}) {
      const { limit, ...page } = listRequest('mysqlStore.list', options, 2);
      const { text, values } = sql.list(limit, page);
      const rows = await own(() => run<MysqlSummaryRow[]>(pool, text, values));
      return keysetPage(rows.map(summaryOfRow), limit);
    },

    async get(scope, key, options) {
      const text = options?.response ? sql.GET_WITH_RESPONSE : sql.GET;
      const [row] = await own(() => run<(MysqlSummaryRow & ResponseRow)[]>(pool, text, { scope, key }));
      return row && keyRecordOf(summaryOfRow(row), row, options);
    },

    async delete(scope, key) {
      return changed(scope, key, await own(() => run<ResultSetHeader>(pool, sql.DELETE, { scope, key })));
    },

    atomic(input, work) {
      return deduplicated(input, (waitMs) => atomicOnConnection({ ...input, waitMs }, work));
    },

    async close() {
      waiters.wakeAll();
      if (ownsPool) await pool.end();
    },
  };
}

function summaryOfRow(row: MysqlSummaryRow) {
  return summaryOf({ ...row, scope: row.scope.toString('utf8'), key: row.key.toString('utf8') });
}
