import { CompiledQuery, type ControlledTransaction, type Kysely } from 'kysely';
import { ConfigError } from '../../../core/contract/index.js';
import { databaseErrorCode, type SqlDialect, type SqlDriver, type SqlResult } from '../driver.js';
import { type SqlStore, type SqlStoreOptions, sqlStore } from '../store.js';

export type { SqlStore, SqlStoreOptions } from '../store.js';

/**
 * The operation's transaction as Kysely gives it: a `Transaction<DB>` (every query builder of
 * `db`), controlled, so that a handler nests the Kysely way, with a savepoint:
 * `const inner = await tx.savepoint('sp').execute()`, then `inner.releaseSavepoint('sp')` or
 * `inner.rollbackToSavepoint('sp')`. A `Transaction` from `db.transaction()` has no savepoints
 * (and its `transaction()` throws), which is why the operation's is opened by `startTransaction()`.
 */
export type KyselyTx<DB> = ControlledTransaction<DB, any[]>;

const ADAPTERS: Record<string, SqlDialect> = {
  PostgresAdapter: 'postgres',
  MysqlAdapter: 'mysql',
  SqliteAdapter: 'sqlite',
};

/**
 * The dialect of Kysely's built-in adapter that `db`'s adapter is or extends, known by class name
 * rather than `instanceof`: a dialect package may bring a copy of Kysely of its own.
 */
function dialectOf(db: Kysely<any>): SqlDialect {
  const adapter = db.getExecutor().adapter;
  for (let proto = Object.getPrototypeOf(adapter); proto; proto = Object.getPrototypeOf(proto)) {
    const dialect = ADAPTERS[(proto.constructor as { name?: string } | undefined)?.name ?? ''];
    if (dialect) return dialect;
  }
  throw new ConfigError(
    `kyselyDriver: the Kysely instance's adapter (${adapter.constructor.name}) is none of PostgreSQL's, MySQL's or SQLite's`,
  );
}

async function run<Row>(on: Kysely<any>, sql: string, params: readonly unknown[]): Promise<SqlResult<Row>> {
  const result = await on.executeQuery<Row>(CompiledQuery.raw(sql, [...params]));
  return { rows: [...result.rows], affected: Number(result.numAffectedRows ?? 0n) };
}

/** Rolls `tx` back, ignoring a failure: the caller rethrows the error that made it roll back. */
function rollBackQuietly<DB>(tx: KyselyTx<DB>): Promise<void> {
  return tx
    .rollback()
    .execute()
    .catch(() => {});
}

/**
 * A SQL driver over a Kysely instance: retrysafe's statements run as raw compiled queries on it,
 * and an operation's transaction is a Kysely transaction the handler gets as `ctx.tx`.
 * @example
 * const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) }); // or MysqlDialect (mysql2)
 * const store = sqlStore(kyselyDriver(db), { migrate: true });
 */
export function kyselyDriver<DB>(db: Kysely<DB>): SqlDriver<KyselyTx<DB>> {
  return {
    dialect: dialectOf(db),
    name: 'kysely',
    query: (sql, params) => run(db, sql, params),
    async transaction(work) {
      const tx = await db.startTransaction().execute();
      let result: Awaited<ReturnType<typeof work>>;
      try {
        result = await work(tx);
      } catch (error) {
        // What `work` threw is the answer; a rollback that fails too (a dead connection) still
        // gives the connection back, and the database drops the transaction with it.
        await rollBackQuietly(tx);
        throw error;
      }
      try {
        await tx.commit().execute();
      } catch (error) {
        // Kysely gives the connection back after a commit PostgreSQL turned into a rollback, not
        // after one that failed on the way (a lost connection): the rollback does (a no-op after
        // the former).
        await rollBackQuietly(tx);
        throw error;
      }
      return result;
    },
    // A handler that ended the transaction through Kysely (`tx.commit()`, `tx.rollback()`) left
    // what follows outside any transaction, as a raw COMMIT does; Kysely refuses `tx` from then on,
    // so the store's statements run on `db`, where the store sees that the transaction has ended.
    queryIn: (tx, sql, params) => run(tx.isCommitted || tx.isRolledBack ? db : tx, sql, params),
    errorCode: databaseErrorCode,
  };
}

/**
 * A retrysafe store on the database a Kysely instance writes to. In atomic mode a handler's
 * `ctx.tx` is the Kysely transaction holding the key: the key, the handler's writes through it and
 * the saved answer commit together, and `ctx.tx.savepoint()` nests inside it.
 * @example
 * ```ts
 * import { Kysely, PostgresDialect } from 'kysely';
 * import { kyselyStore } from 'retrysafe/kysely';
 * const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) });
 * const store = kyselyStore(db, { migrate: true });
 * // in a handler: await idem.tx.insertInto('orders').values({ item }).execute();
 * ```
 */
export function kyselyStore<DB>(db: Kysely<DB>, options?: SqlStoreOptions): SqlStore<KyselyTx<DB>> {
  return sqlStore(kyselyDriver(db), options);
}
