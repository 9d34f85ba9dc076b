import type { SqlEntityManager } from '@mikro-orm/knex';
import type { Knex } from 'knex';
import { ConfigError } from '../../../core/contract/index.js';
import { databaseErrorCode, type SqlDriver } from '../driver.js';
import { type SqlStore, type SqlStoreOptions, sqlStore } from '../store.js';
import { knexStatements } from './knex.js';

export type { SqlStore, SqlStoreOptions } from '../store.js';

/** What the store takes: a `MikroORM` instance of a SQL driver, or its `EntityManager`. */
export type MikroOrmSource<EM extends SqlEntityManager> = EM | { em: EM };

/**
 * A SQL driver over MikroORM 6 (`@mikro-orm/postgresql`; `@mikro-orm/mysql` for MySQL or
 * MariaDB; `@mikro-orm/better-sqlite` for SQLite): an operation's transaction is `em.transactional()`, whose forked `EntityManager` the
 * handler gets as `ctx.tx`, and a `tx.transactional()` it opens there nests as a savepoint. MikroORM
 * 6 runs SQL through Knex: retrysafe's statements run as Knex `raw` ones on the transaction's Knex
 * context, as the Knex driver runs them.
 * @example
 * const orm = await MikroORM.init({ clientUrl: process.env.DATABASE_URL, entities: [Order] });
 * const store = sqlStore(mikroOrmDriver(orm), { migrate: true });
 */
export function mikroOrmDriver<EM extends SqlEntityManager>(source: MikroOrmSource<EM>): SqlDriver<EM> {
  const em = (source as { em?: EM }).em ?? (source as EM);
  if (typeof em?.getKnex !== 'function' || typeof em.transactional !== 'function') {
    throw new ConfigError(
      'mikroOrmStore: give a MikroORM instance (or its EntityManager) of a SQL driver: @mikro-orm/postgresql, @mikro-orm/mysql or @mikro-orm/better-sqlite',
    );
  }
  // MikroORM brings a Knex of its own: its instance is what runs the statements.
  const knex = em.getKnex() as unknown as Knex;
  const found = knexStatements(knex);
  if (!found) {
    throw new ConfigError(
      `mikroOrmDriver: MikroORM runs on ${String(knex.client.driverName)}; retrysafe's MikroORM driver runs on @mikro-orm/postgresql, @mikro-orm/mysql and @mikro-orm/better-sqlite`,
    );
  }
  const { dialect, run } = found;
  return {
    dialect,
    name: 'mikroOrm',
    query: (sql, params) => run(knex, sql, params),
    transaction: (work) => em.transactional((tx) => work(tx as EM)),
    queryIn(tx, sql, params) {
      const trx = tx.getTransactionContext<Knex.Transaction>();
      if (!trx) throw new ConfigError("mikroOrmDriver: the EntityManager is no transaction's");
      // A transaction ended through Knex refuses statements: they run outside, where the store
      // sees that it has ended.
      return run(trx.isCompleted() ? knex : trx, sql, params);
    },
    errorCode: databaseErrorCode,
  };
}

/**
 * A retrysafe store on the PostgreSQL, MySQL, MariaDB or SQLite database a MikroORM 6 instance
 * writes to. In atomic mode a handler's `ctx.tx` is the transaction's `EntityManager` (a fork, as
 * `em.transactional()` gives it), holding the key: the key, the handler's writes through it
 * (flushed by the commit at the latest) and the saved answer commit together, and
 * `ctx.tx.transactional()` is a savepoint inside it.
 * @example
 * ```ts
 * import { MikroORM } from '@mikro-orm/postgresql';
 * import { mikroOrmStore } from 'retrysafe/mikro-orm';
 * const orm = await MikroORM.init({ clientUrl: process.env.DATABASE_URL, entities: [Order] });
 * const store = mikroOrmStore(orm, { migrate: true });
 * // in a handler: idem.tx.create(Order, { item }); await idem.tx.flush();
 * ```
 */
export function mikroOrmStore<EM extends SqlEntityManager>(
  source: MikroOrmSource<EM>,
  options?: SqlStoreOptions,
): SqlStore<EM> {
  return sqlStore(mikroOrmDriver(source), options);
}
