import type { Knex } from 'knex';
import { ConfigError } from '../../../core/contract/index.js';
import { databaseErrorCode, type SqlDialect, type SqlDriver, type SqlResult } from '../driver.js';
import { type SqlStore, type SqlStoreOptions, sqlStore } from '../store.js';
import { knexPlaceholders } from './knex-placeholders.js';
import { mysqlResultOf } from './results.js';

export type { SqlStore, SqlStoreOptions } from '../store.js';

async function runPostgres<Row>(on: Knex, sql: string, params: readonly unknown[]): Promise<SqlResult<Row>> {
  const statement = knexPlaceholders(sql, params);
  // Knex answers a raw statement on PostgreSQL with node-postgres' own result.
  const result: { rows?: Row[]; rowCount?: number | null; command?: string } = await on.raw(
    statement.sql,
    statement.bindings as Knex.RawBinding[],
  );
  const changed = result.command === 'INSERT' || result.command === 'UPDATE' || result.command === 'DELETE';
  return { rows: result.rows ?? [], affected: changed ? (result.rowCount ?? 0) : 0 };
}

/** On mysql2, Knex answers a raw statement with mysql2's `[rows, fields]`. */
async function runMysql<Row>(on: Knex, sql: string, params: readonly unknown[]): Promise<SqlResult<Row>> {
  return mysqlResultOf(await on.raw(sql, params as Knex.RawBinding[]));
}

/**
 * On better-sqlite3, Knex answers a raw statement that returns rows (a SELECT, a RETURNING) with
 * them, and any other with better-sqlite3's `{ changes }`.
 */
async function runSqlite<Row>(on: Knex, sql: string, params: readonly unknown[]): Promise<SqlResult<Row>> {
  const result = (await on.raw(sql, params as Knex.RawBinding[])) as Row[] | { changes?: number };
  if (Array.isArray(result)) return { rows: result, affected: 0 };
  return { rows: [], affected: Number(result.changes ?? 0) };
}

/** The clients of Knex's that retrysafe speaks to, by the driver they run on. */
const DIALECTS: Record<string, { dialect: SqlDialect; run: typeof runPostgres }> = {
  pg: { dialect: 'postgres', run: runPostgres },
  mysql2: { dialect: 'mysql', run: runMysql },
  'better-sqlite3': { dialect: 'sqlite', run: runSqlite },
};

/**
 * How retrysafe's statements run on `knex` (or on a transaction of it): its dialect and a runner,
 * by the client Knex runs on; `undefined` for a client retrysafe does not speak to. Shared with
 * the ORMs built on Knex (MikroORM).
 */
export function knexStatements(knex: Knex): (typeof DIALECTS)[string] | undefined {
  const driverName = String(knex.client.driverName);
  return Object.hasOwn(DIALECTS, driverName) ? DIALECTS[driverName] : undefined;
}

/**
 * A SQL driver over a Knex instance (PostgreSQL on `pg`, MySQL or MariaDB on `mysql2`, SQLite on
 * `better-sqlite3`): retrysafe's statements run as `raw` ones, and
 * an operation's transaction is a `knex.transaction()`, whose `trx` the handler gets as `ctx.tx`;
 * a `trx.transaction()` it opens nests as a savepoint, the Knex way.
 * @example
 * const knex = Knex({ client: 'pg', connection: process.env.DATABASE_URL });
 * const store = sqlStore(knexDriver(knex), { migrate: true });
 */
export function knexDriver(knex: Knex): SqlDriver<Knex.Transaction> {
  const found = knexStatements(knex);
  if (!found) {
    throw new ConfigError(
      `knexDriver: Knex runs on ${String(knex.client.driverName)}; retrysafe's Knex driver runs on pg (PostgreSQL), mysql2 (MySQL, MariaDB) and better-sqlite3 (SQLite)`,
    );
  }
  const { dialect, run } = found;
  return {
    dialect,
    name: 'knex',
    query: (sql, params) => run(knex, sql, params),
    async transaction<T>(work: (tx: Knex.Transaction) => Promise<T>): Promise<T> {
      let running: Promise<T> | undefined;
      const failed = await knex
        .transaction((trx) => {
          running = work(trx);
          return running;
        })
        .then(
          () => undefined,
          (error: unknown) => ({ error }),
        );
      // No transaction: BEGIN or the connection failed.
      if (running === undefined) throw failed!.error;
      // Knex settles as soon as the handler ends the transaction itself (`trx.commit()`), and
      // rejects with an error of its own when `work` threw no Error: the answer is what `work`
      // did (its own throw as thrown), unless Knex's COMMIT failed.
      const value = await running;
      if (failed) throw failed.error;
      return value;
    },
    // A handler that ended the transaction through Knex (`trx.commit()`, `trx.rollback()`) left
    // what follows outside any transaction, as a raw COMMIT does; Knex refuses `trx` from then on,
    // so the store's statements run on `knex`, where the store sees that the transaction has ended.
    queryIn: (tx, sql, params) => run(tx.isCompleted() ? knex : tx, sql, params),
    errorCode: databaseErrorCode,
  };
}

/**
 * A retrysafe store on the PostgreSQL, MySQL, MariaDB or SQLite database a Knex instance writes to. In atomic mode a
 * handler's `ctx.tx` is the Knex transaction (`trx`) holding the key: the key, the handler's
 * writes through it and the saved answer commit together, and `ctx.tx.transaction()` is a
 * savepoint inside it.
 * @example
 * ```ts
 * import Knex from 'knex';
 * import { knexStore } from 'retrysafe/knex';
 * const knex = Knex({ client: 'pg', connection: process.env.DATABASE_URL });
 * const store = knexStore(knex, { migrate: true });
 * // in a handler: await idem.tx('orders').insert({ item });
 * ```
 */
export function knexStore(knex: Knex, options?: SqlStoreOptions): SqlStore<Knex.Transaction> {
  return sqlStore(knexDriver(knex), options);
}
