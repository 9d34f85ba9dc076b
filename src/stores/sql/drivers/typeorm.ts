import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import { ConfigError } from '../../../core/contract/index.js';
import { databaseErrorCode, type SqlDriver, type SqlResult } from '../driver.js';
import { type SqlStore, type SqlStoreOptions, sqlStore } from '../store.js';

export type { SqlStore, SqlStoreOptions } from '../store.js';

/**
 * One statement on `runner`, with TypeORM's structured result: its records, and node-postgres'
 * row count as `affected` (for a SELECT, that is the number of rows it answered).
 */
async function run<Row>(
  runner: QueryRunner,
  sql: string,
  params: readonly unknown[],
): Promise<SqlResult<Row>> {
  const result = await runner.query(sql, [...params], true);
  return { rows: (result.records ?? []) as Row[], affected: result.affected ?? 0 };
}

/**
 * A SQL driver over a TypeORM `DataSource` (PostgreSQL): retrysafe's statements run as raw
 * queries, and an operation's transaction is a `dataSource.transaction()`, whose `EntityManager`
 * the handler gets as `ctx.tx`; a `manager.transaction()` it opens there nests as a savepoint,
 * the TypeORM way.
 * @example
 * const dataSource = await new DataSource({ type: 'postgres', url, entities }).initialize();
 * const store = sqlStore(typeormDriver(dataSource), { migrate: true });
 */
export function typeormDriver(dataSource: DataSource): SqlDriver<EntityManager> {
  if (dataSource.options.type !== 'postgres') {
    throw new ConfigError(
      `typeormDriver: the DataSource's type is ${dataSource.options.type}; retrysafe's TypeORM driver runs on postgres`,
    );
  }
  return {
    dialect: 'postgres',
    name: 'typeorm',
    async query(sql, params) {
      const runner = dataSource.createQueryRunner();
      try {
        return await run(runner, sql, params);
      } finally {
        await runner.release();
      }
    },
    transaction: (work) => dataSource.transaction((manager) => work(manager)),
    queryIn(tx, sql, params) {
      // The manager of a transaction holds the query runner (one connection) the transaction is on.
      if (!tx.queryRunner) throw new ConfigError("typeormDriver: the EntityManager is no transaction's");
      return run(tx.queryRunner, sql, params);
    },
    errorCode: databaseErrorCode,
  };
}

/**
 * A retrysafe store on the PostgreSQL database a TypeORM `DataSource` writes to. In atomic mode a
 * handler's `ctx.tx` is the transaction's `EntityManager`, holding the key: the key, the handler's
 * writes through it and the saved answer commit together, and `ctx.tx.transaction()` is a
 * savepoint inside it.
 * @example
 * ```ts
 * import { DataSource } from 'typeorm';
 * import { typeormStore } from 'retrysafe/typeorm';
 * const dataSource = await new DataSource({ type: 'postgres', url, entities: [Order] }).initialize();
 * const store = typeormStore(dataSource, { migrate: true });
 * // in a handler: await idem.tx.getRepository(Order).insert({ item });
 * ```
 */
export function typeormStore(dataSource: DataSource, options?: SqlStoreOptions): SqlStore<EntityManager> {
  return sqlStore(typeormDriver(dataSource), options);
}
