import pg from 'pg';
import { ConfigError } from '../../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../../core/options/index.js';
import type { AtomicStore, PhaseStore } from '../../core/store.js';
import { requirePositiveInteger } from '../internal.js';
import { pgDriver } from '../sql/drivers/pg.js';
import { sqlStore } from '../sql/store.js';
import { postgresMigrationSql } from './migrate.js';

export { postgresMigrationSql };

/** Options of {@link postgresStore}: one of `pool` or `url`. */
export interface PostgresStoreOptions {
  /**
   * A `pg` pool to use. The store never ends it, and its owner should handle its `error` event
   * (a dropped idle connection is otherwise an uncaught error). One of `pool`/`url`.
   * @default undefined
   * @example pool: new pg.Pool({ connectionString: process.env.DATABASE_URL })
   */
  pool?: pg.Pool;
  /**
   * A `postgres://` URL; the store then owns a pool built with the timeouts below.
   * @default undefined
   * @example url: 'postgres://app@127.0.0.1:5432/app'
   */
  url?: string;
  /**
   * Schema of the table; `migrate()` creates it when missing.
   * @default 'public'
   * @example schema: 'shop'
   */
  schema?: string;
  /**
   * The table holding the records.
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
   * Server-side `statement_timeout` of the store's own pool (a client-side guard fires a second
   * later for a network that stopped answering). Also bounds an atomic claim given no `timeoutMs`.
   * @default 15000
   */
  statementTimeoutMs?: number;
  /**
   * `client_connection_check_interval` of the store's own pool (PostgreSQL 14+): how often a
   * backend running a query checks that its client is still there, and ends the query when it is
   * not. A process that died (kill -9, a lost host) then leaves no statement queued on a lock to
   * commit after its lease, when a retry has run the handler again. `0` turns it off. Set the
   * same on a pool you pass in: `options: '-c client_connection_check_interval=1000'`.
   * @default 1000
   */
  connectionCheckIntervalMs?: number;
  /**
   * Create the schema, table and index on first use when they are missing, as `migrate()` does.
   * Off by default: the table is then made by `retrysafe migrate` (or your own migration tool,
   * from `retrysafe migrate --print`), and a store without it fails every call with a
   * `ConfigError` saying so.
   * @default false
   */
  migrate?: boolean;
  /**
   * What `url` (or `pool`) connects to. `'session'`: each connection is a PostgreSQL
   * session of its own (a direct connection, or a pooler in session mode). `'transaction'`: a
   * pooler in transaction mode (PgBouncer's `pool_mode = transaction`), where consecutive
   * transactions of one connection may run on different server sessions. The store then sends no
   * startup parameters (PgBouncer refuses them: set `statement_timeout` and
   * `client_connection_check_interval` on the database role instead), prepares no statement
   * (neither `pg`'s named ones nor SQL `PREPARE`), keeps every setting it makes `SET LOCAL` to one
   * transaction, and waits by polling, since `LISTEN` holds no session there to be notified on.
   * @default 'session'
   * @example pooling: 'transaction'
   */
  pooling?: 'session' | 'transaction';
}

/** The PostgreSQL store: lease mode through the `IdempotencyStore` methods, atomic mode through `atomic`. */
export interface PostgresStore extends AtomicStore<pg.PoolClient>, PhaseStore<pg.PoolClient> {
  /**
   * Creates the schema, table and index when missing (the statements of `postgresMigrationSql`);
   * safe to run again and concurrently.
   */
  migrate(): Promise<void>;
  /** The pool the store queries; handlers in atomic mode get a client of it as `tx`. */
  readonly pool: pg.Pool;
}

const OPTION_NAMES = optionNames<PostgresStoreOptions>({
  pool: true,
  url: true,
  schema: true,
  table: true,
  maxConnections: true,
  connectTimeoutMs: true,
  statementTimeoutMs: true,
  connectionCheckIntervalMs: true,
  migrate: true,
  pooling: true,
});

/**
 * A store on PostgreSQL through `pg`, for several app servers or hosts sharing one database: the
 * SQL store (`retrysafe/sql`) over a driver of the pool, which adds what only `pg` can send.
 * Claims are one `INSERT … ON CONFLICT` on the `(scope, key)` primary key; every time comes from
 * the database server's clock; waits use `LISTEN/NOTIFY` (one listening connection per store) with
 * polling as the fallback. `atomic()` runs the claim, the handler's queries on `tx` and the saved
 * response in one transaction: a crash leaves all of it or none of it, and a concurrent duplicate
 * blocks on the primary key until the first commits (then replays) or rolls back (then runs).
 *
 * Create its table once before use: `migrate()`, `retrysafe migrate --database-url …`, the SQL of
 * `retrysafe migrate --print` in your own migration tool, or the `migrate: true` option. Without
 * it every call fails with a `ConfigError` that says so.
 *
 * @example
 * ```ts
 * import { postgresStore } from 'retrysafe/postgres';
 * const store = postgresStore({ url: process.env.DATABASE_URL, schema: 'app' });
 * await store.migrate();
 * ```
 */
export function postgresStore(given: PostgresStoreOptions): PostgresStore {
  const options = checkOptions('postgresStore()', given, OPTION_NAMES);
  if ((options.pool === undefined) === (options.url === undefined)) {
    throw new ConfigError('postgresStore: give exactly one of `pool` or `url`');
  }
  const maxConnections = requirePositiveInteger(
    'postgresStore',
    'maxConnections',
    options.maxConnections ?? 10,
  );
  const connectTimeoutMs = requirePositiveInteger(
    'postgresStore',
    'connectTimeoutMs',
    options.connectTimeoutMs ?? 5000,
  );
  const statementTimeoutMs = requirePositiveInteger(
    'postgresStore',
    'statementTimeoutMs',
    options.statementTimeoutMs ?? 15_000,
  );
  const pooling = options.pooling ?? 'session';
  if (pooling !== 'session' && pooling !== 'transaction') {
    throw new ConfigError(
      `postgresStore: option \`pooling\` must be 'session' or 'transaction'; got ${JSON.stringify(options.pooling)}`,
    );
  }
  const sessions = pooling === 'session';
  if (!sessions && options.connectionCheckIntervalMs !== undefined) {
    throw new ConfigError(
      "postgresStore: option `connectionCheckIntervalMs` cannot reach PostgreSQL through a transaction pooler (`pooling: 'transaction'`); set it on the role: ALTER ROLE app SET client_connection_check_interval = 1000",
    );
  }
  const connectionCheckIntervalMs = options.connectionCheckIntervalMs ?? 1000;
  if (!Number.isSafeInteger(connectionCheckIntervalMs) || connectionCheckIntervalMs < 0) {
    throw new ConfigError(
      `postgresStore: option \`connectionCheckIntervalMs\` must be a whole number of ms, 0 or more; got ${String(options.connectionCheckIntervalMs)}`,
    );
  }

  const ownsPool = options.pool === undefined;
  const pool =
    options.pool ??
    new pg.Pool({
      connectionString: options.url,
      max: maxConnections,
      connectionTimeoutMillis: connectTimeoutMs,
      query_timeout: timerMs(statementTimeoutMs + 1000),
      keepAlive: true,
      application_name: 'retrysafe',
      // Startup parameters, which PgBouncer refuses.
      ...(sessions && {
        statement_timeout: timerMs(statementTimeoutMs),
        options: `-c client_connection_check_interval=${connectionCheckIntervalMs}`,
      }),
    });
  // A connection dropped while idle (database restart) surfaces here; the next query reconnects.
  if (ownsPool) pool.on('error', () => {});

  // Behind a transaction pooler nothing of a session carries over: no prepared statement, no LISTEN.
  const driver = pgDriver(pool, { prepared: sessions, listen: sessions, connectTimeoutMs });
  const { schema, table, migrate } = options;
  const store = sqlStore(driver, { schema, table, migrate, statementTimeoutMs });
  return {
    ...store,
    pool,
    async close() {
      await store.close();
      await driver.close();
      if (ownsPool) await pool.end();
    },
  };
}
