import { is, type SQL, sql } from 'drizzle-orm';
import { MySqlDatabase, type MySqlQueryResultHKT, type MySqlTransaction } from 'drizzle-orm/mysql-core';
import { PgDatabase, type PgQueryResultHKT, type PgTransaction } from 'drizzle-orm/pg-core';
import { ConfigError } from '../../../core/contract/index.js';
import { databaseErrorCode, type SqlDialect, type SqlDriver } from '../driver.js';
import { type SqlStore, type SqlStoreOptions, sqlStore } from '../store.js';
import { mysqlResultOf, pgResultOf } from './results.js';

export type { SqlStore, SqlStoreOptions } from '../store.js';

type AnyPgDatabase = PgDatabase<PgQueryResultHKT, any, any>;
type AnyMySqlDatabase = MySqlDatabase<MySqlQueryResultHKT, any, any, any>;

/** The `tx` Drizzle hands a `db.transaction()` callback of `D`: what a handler gets as `ctx.tx`. */
export type DrizzleTransaction<D extends AnyPgDatabase | AnyMySqlDatabase> =
  D extends PgDatabase<infer Q, infer F, infer S>
    ? PgTransaction<Q, F, S>
    : D extends MySqlDatabase<infer Q, infer P, infer F, infer S>
      ? MySqlTransaction<Q, P, F, S>
      : never;

/** PostgreSQL's `$n`; MySQL's `?` outside quoted strings and identifiers, taken in order. */
const PLACEHOLDERS: Record<'postgres' | 'mysql', RegExp> = {
  postgres: /\$(\d+)/g,
  mysql: /'(?:[^'\\]|\\.|'')*'|`(?:[^`]|``)*`|(\?)/g,
};

/** `text` with its placeholders as Drizzle parameters (Drizzle writes them again its way). */
function drizzleSql(dialect: 'postgres' | 'mysql', text: string, params: readonly unknown[]): SQL {
  const chunks: SQL[] = [];
  let last = 0;
  let next = 0;
  for (const match of text.matchAll(PLACEHOLDERS[dialect])) {
    if (match[1] === undefined) continue;
    const value = dialect === 'postgres' ? params[Number(match[1]) - 1] : params[next++];
    chunks.push(sql.raw(text.slice(last, match.index)), sql`${value}`);
    last = match.index + match[0].length;
  }
  chunks.push(sql.raw(text.slice(last)));
  return sql.join(chunks);
}

/**
 * Drizzle (PostgreSQL: node-postgres or postgres.js; MySQL or MariaDB: mysql2) as a SQL store's
 * driver: its `transaction()` opens the operation's transaction, and a handler's
 * `tx.transaction()` nests as a savepoint.
 */
export function drizzleDriver<D extends AnyPgDatabase | AnyMySqlDatabase>(
  db: D,
): SqlDriver<DrizzleTransaction<D>> {
  const dialect: SqlDialect | undefined = is(db, PgDatabase)
    ? 'postgres'
    : is(db, MySqlDatabase)
      ? 'mysql'
      : undefined;
  if (!dialect) {
    throw new ConfigError(
      'drizzleStore: give a Drizzle PostgreSQL database (drizzle-orm/node-postgres or postgres-js) or a MySQL one (drizzle-orm/mysql2)',
    );
  }
  const decode = dialect === 'postgres' ? pgResultOf : mysqlResultOf;
  // Both database classes have `execute(sql)` and `transaction(work)`; only their types differ.
  const on = db as unknown as {
    execute(query: SQL): Promise<unknown>;
    transaction<T>(work: (tx: DrizzleTransaction<D>) => Promise<T>): Promise<T>;
  };
  return {
    dialect,
    name: 'drizzle',
    async query(text, params) {
      return decode(await on.execute(drizzleSql(dialect, text, params)));
    },
    transaction(work) {
      return on.transaction((tx) => work(tx));
    },
    async queryIn(tx, text, params) {
      const inTx = tx as unknown as { execute(query: SQL): Promise<unknown> };
      return decode(await inTx.execute(drizzleSql(dialect, text, params)));
    },
    errorCode: databaseErrorCode,
  };
}

/**
 * A retrysafe store on the database a Drizzle `db` writes to. In atomic mode a handler's `ctx.tx`
 * is Drizzle's transaction: the key, the handler's writes through it and the saved answer commit
 * together, and `ctx.tx.transaction()` is a savepoint inside it.
 * @example
 * ```ts
 * import { drizzle } from 'drizzle-orm/node-postgres';
 * import { drizzleStore } from 'retrysafe/drizzle';
 * const db = drizzle(process.env.DATABASE_URL);
 * const store = drizzleStore(db, { migrate: true });
 * ```
 */
export function drizzleStore<D extends AnyPgDatabase | AnyMySqlDatabase>(
  db: D,
  options?: SqlStoreOptions,
): SqlStore<DrizzleTransaction<D>> {
  return sqlStore(drizzleDriver(db), options);
}
