import mysql, { type Pool, type PoolConnection } from 'mysql2/promise';
import { ConfigError } from '../../core/contract/index.js';
import { checkOptions, optionNames } from '../../core/options/index.js';
import { requirePositiveInteger } from '../internal.js';
import { type SqlStore, sqlStore } from '../sql/store.js';
import { mysql2Driver } from './driver.js';
import { identifier, mysqlMigrationSql } from './migrate.js';

export { mysqlMigrationSql };

/** Options of {@link mysqlStore}: one of `pool` or `url`. */
export interface MysqlStoreOptions {
  /**
   * A `mysql2/promise` pool to use; the store never ends it. One of `pool`/`url`.
   * @default undefined
   * @example pool: mysql.createPool({ uri: process.env.DATABASE_URL })
   */
  pool?: Pool;
  /**
   * A `mysql://` URL naming the database; the store then owns a pool built from it.
   * @default undefined
   * @example url: 'mysql://app@127.0.0.1:3306/app'
   */
  url?: string;
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
export interface MysqlStore extends SqlStore<PoolConnection> {
  /** The pool the store queries; handlers in atomic mode get a connection of it as `tx`. */
  readonly pool: Pool;
}

const OPTION_NAMES = optionNames<MysqlStoreOptions>({
  pool: true,
  url: true,
  table: true,
  maxConnections: true,
  connectTimeoutMs: true,
  migrate: true,
});

/**
 * A store on MySQL 8 or MariaDB 10.6+ through `mysql2`, for several app servers or hosts sharing
 * one database: the SQL store's MySQL dialect over a `mysql2` pool. A claim is one
 * `INSERT … ON DUPLICATE KEY UPDATE` on the `(scope, key)` primary key whose update takes the
 * record over only when its retention or (same fingerprint) its lease has passed, so of
 * concurrent claims exactly one writes its owner token; every time comes from the database
 * server's clock; waits poll with backoff (woken at once by changes made through this store in
 * this process). `atomic()` runs the claim, the handler's queries on `tx` (a connection of the
 * pool) and the saved response in one InnoDB transaction: a crash leaves all of it or none of it,
 * and a concurrent duplicate blocks on the record's row lock until the first commits (then
 * replays) or rolls back (then runs).
 *
 * Create its table once before use: `migrate()`, `retrysafe migrate --database-url mysql://…`,
 * the SQL of `retrysafe migrate --print` in your own migration tool, or the `migrate: true`
 * option. Without it every call fails with a `ConfigError` that says so.
 *
 * @example
 * ```ts
 * import { mysqlStore } from 'retrysafe/mysql';
 * const store = mysqlStore({ url: 'mysql://app@127.0.0.1:3306/app' });
 * await store.migrate();
 * ```
 */
export function mysqlStore(given: MysqlStoreOptions): MysqlStore {
  const options = checkOptions('mysqlStore()', given, OPTION_NAMES);
  if ((options.pool === undefined) === (options.url === undefined)) {
    throw new ConfigError('mysqlStore: give exactly one of `pool` or `url`');
  }
  const maxConnections = requirePositiveInteger('mysqlStore', 'maxConnections', options.maxConnections ?? 10);
  const connectTimeoutMs = requirePositiveInteger(
    'mysqlStore',
    'connectTimeoutMs',
    options.connectTimeoutMs ?? 5000,
  );
  // Every option is checked before the store makes a pool of its own.
  const table = identifier('table', options.table ?? 'idempotency_keys');
  const ownsPool = options.pool === undefined;
  const pool =
    options.pool ??
    mysql.createPool({
      uri: options.url,
      connectionLimit: maxConnections,
      connectTimeout: connectTimeoutMs,
      enableKeepAlive: true,
    });
  const store = sqlStore(mysql2Driver(pool), { table, migrate: options.migrate });
  return {
    ...store,
    pool,
    async close() {
      await store.close();
      if (ownsPool) await pool.end();
    },
  };
}
