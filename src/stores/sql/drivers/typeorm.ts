import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import { ConfigError } from '../../../core/contract/index.js';
import { databaseErrorCode, type SqlDialect, type SqlDriver, type SqlResult } from '../driver.js';
import { type SqlStore, type SqlStoreOptions, sqlStore } from '../store.js';
import { oneAtATime } from './one-at-a-time.js';

export type { SqlStore, SqlStoreOptions } from '../store.js';

/**
 * One statement on `runner`, with TypeORM's structured result: its records, and the driver's
 * count as `affected` (node-postgres' row count, which for a SELECT is the number of rows it
 * answered; mysql2's `affectedRows`, the rows a write matched).
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
 * A SQL driver over a TypeORM `DataSource` (PostgreSQL; MySQL or MariaDB on mysql2; SQLite on
 * better-sqlite3): retrysafe's statements run as raw
 * queries, and an operation's transaction is a `dataSource.transaction()`, whose `EntityManager`
 * the handler gets as `ctx.tx`; a `manager.transaction()` it opens there nests as a savepoint,
 * the TypeORM way.
 * @example
 * const dataSource = await new DataSource({ type: 'postgres', url, entities }).initialize();
 * const store = sqlStore(typeormDriver(dataSource), { migrate: true });
 */
export function typeormDriver(dataSource: DataSource): SqlDriver<EntityManager> {
  const { type } = dataSource.options;
  const dialect: SqlDialect | undefined =
    type === 'postgres'
      ? 'postgres'
      : type === 'mysql' || type === 'mariadb'
        ? 'mysql'
        : type === 'better-sqlite3'
          ? 'sqlite'
          : undefined;
  if (!dialect) {
    throw new ConfigError(
      `typeormDriver: the DataSource's type is ${type}; retrysafe's TypeORM driver runs on postgres, mysql, mariadb and better-sqlite3`,
    );
  }
  const inTurn = dialect === 'sqlite' ? oneAtATime(dataSource) : <T>(fn: () => Promise<T>) => fn();
  return {
    dialect,
    name: 'typeorm',
    query: (sql, params) =>
      inTurn(async () => {
        const runner = dataSource.createQueryRunner();
        try {
          return await run(runner, sql, params);
        } finally {
          await runner.release();
        }
      }),
    transaction: (work) =>
      inTurn(async () => {
        try {
          return await dataSource.transaction((manager) => work(manager));
        } finally {
          if (dialect === 'sqlite') forgetEndedTransaction(dataSource);
        }
      }),
    queryIn(tx, sql, params) {
      // The manager of a transaction holds the query runner (one connection) the transaction is on.
      if (!tx.queryRunner) throw new ConfigError("typeormDriver: the EntityManager is no transaction's");
      return run(tx.queryRunner, sql, params);
    },
    errorCode: databaseErrorCode,
  };
}

/**
 * A handler that ended the transaction itself (a raw `COMMIT`) leaves TypeORM's shared SQLite
 * query runner believing it is still open: its own COMMIT or ROLLBACK then failed (SQLite has no
 * transaction to end), and every later transaction would open as a savepoint of none. When the
 * connection is in no transaction, the runner is told so.
 */
function forgetEndedTransaction(dataSource: DataSource): void {
  const runner = dataSource.createQueryRunner() as unknown as {
    isTransactionActive: boolean;
    transactionDepth: number;
  };
  const connection = (dataSource.driver as unknown as { databaseConnection?: { inTransaction?: boolean } })
    .databaseConnection;
  if (runner.isTransactionActive && connection?.inTransaction === false) {
    runner.isTransactionActive = false;
    runner.transactionDepth = 0;
  }
}

/**
 * A retrysafe store on the PostgreSQL, MySQL, MariaDB or SQLite database a TypeORM `DataSource` writes to. In atomic mode a
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
