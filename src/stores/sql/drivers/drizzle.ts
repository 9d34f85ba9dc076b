import { is, type SQL, sql } from 'drizzle-orm';
import { PgDatabase, type PgQueryResultHKT, type PgTransaction } from 'drizzle-orm/pg-core';
import { ConfigError } from '../../../core/contract/index.js';
import { databaseErrorCode, type SqlDriver, type SqlResult } from '../driver.js';
import { type SqlStore, type SqlStoreOptions, sqlStore } from '../store.js';

export type { SqlStore, SqlStoreOptions } from '../store.js';

type AnyPgDatabase = PgDatabase<PgQueryResultHKT, any, any>;

/** The `tx` Drizzle hands a `db.transaction()` callback of `D`: what a handler gets as `ctx.tx`. */
export type DrizzleTransaction<D extends AnyPgDatabase> =
  D extends PgDatabase<infer Q, infer F, infer S> ? PgTransaction<Q, F, S> : never;

/** `text` with its `$n` placeholders as Drizzle parameters (Drizzle numbers them again). */
function drizzleSql(text: string, params: readonly unknown[]): SQL {
  const chunks: SQL[] = [];
  let last = 0;
  for (const match of text.matchAll(/\$(\d+)/g)) {
    chunks.push(sql.raw(text.slice(last, match.index)), sql`${params[Number(match[1]) - 1]}`);
    last = match.index + match[0].length;
  }
  chunks.push(sql.raw(text.slice(last)));
  return sql.join(chunks);
}

/** node-postgres answers a `QueryResult` (whose `rowCount` counts a SELECT's rows too), postgres.js an array with a `count`. */
function resultOf<Row>(result: unknown): SqlResult<Row> {
  if (Array.isArray(result)) {
    const { count, command } = result as { count?: number; command?: string };
    return { rows: result as Row[], affected: command === 'SELECT' ? 0 : Number(count ?? 0) };
  }
  const { rows, rowCount, command } = result as { rows: Row[]; rowCount: number | null; command?: string };
  return { rows, affected: command === 'SELECT' ? 0 : (rowCount ?? 0) };
}

/**
 * Drizzle (PostgreSQL: node-postgres or postgres.js) as a SQL store's driver: its `transaction()`
 * opens the operation's transaction, and a handler's `tx.transaction()` nests as a savepoint.
 */
export function drizzleDriver<D extends AnyPgDatabase>(db: D): SqlDriver<DrizzleTransaction<D>> {
  if (!is(db, PgDatabase)) {
    throw new ConfigError(
      'drizzleStore: give a Drizzle PostgreSQL database (drizzle-orm/node-postgres or postgres-js)',
    );
  }
  return {
    dialect: 'postgres',
    name: 'drizzle',
    async query(text, params) {
      return resultOf(await db.execute(drizzleSql(text, params)));
    },
    transaction(work) {
      return db.transaction((tx) => work(tx as DrizzleTransaction<D>));
    },
    async queryIn(tx, text, params) {
      return resultOf(await tx.execute(drizzleSql(text, params)));
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
export function drizzleStore<D extends AnyPgDatabase>(
  db: D,
  options?: SqlStoreOptions,
): SqlStore<DrizzleTransaction<D>> {
  return sqlStore(drizzleDriver(db), options);
}
