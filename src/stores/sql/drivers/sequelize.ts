import type { Sequelize, Transaction } from 'sequelize';
import { ConfigError } from '../../../core/contract/index.js';
import { databaseErrorCode, type SqlDialect, type SqlDriver, type SqlResult } from '../driver.js';
import { type SqlStore, type SqlStoreOptions, sqlStore } from '../store.js';
import { oneAtATime } from './one-at-a-time.js';
import { mysqlResultOf, pgResultOf } from './results.js';
import { statementKind } from './statement-kind.js';

export type { SqlStore, SqlStoreOptions } from '../store.js';

/**
 * The client connection Sequelize hands out: node-postgres' `Client`, a mysql2 (callback)
 * connection, or a node-sqlite3 `Database` (`all` answers rows, `run` a count as `this.changes`).
 */
interface Connection {
  query(sql: string, values: unknown[], callback?: (error: unknown, result: unknown) => void): unknown;
  all(sql: string, values: unknown[], callback: (error: unknown, rows: unknown[]) => void): unknown;
  run(sql: string, values: unknown[], callback: (this: { changes: number }, error: unknown) => void): unknown;
}

/** What Sequelize 6 keeps on a transaction without typing it. */
interface OpenTransaction {
  /** The connection the transaction holds (given back to the pool when it ends). */
  connection?: Connection;
  /** `'commit'` or `'rollback'` once it ended. */
  finished?: string;
}

/**
 * Sequelize's dialects the driver speaks to, by their client: node-postgres, mysql2 (for MySQL and
 * MariaDB alike; Sequelize's `mariadb` dialect runs on the `mariadb` client instead), and
 * node-sqlite3 (the `sqlite3` package).
 */
const DIALECTS: Record<string, SqlDialect> = { postgres: 'postgres', mysql: 'mysql', sqlite: 'sqlite' };

/** Bytes as node-postgres, mysql2 and node-sqlite3 take them: a `Buffer` (mysql2 would write a bare `Uint8Array` as an object). */
const asDriverValue = (value: unknown) =>
  value instanceof Uint8Array && !Buffer.isBuffer(value)
    ? Buffer.from(value.buffer, value.byteOffset, value.byteLength)
    : value;

/** One statement on a client connection of Sequelize's, with the client's own placeholders and result. */
function runOn<Row>(
  dialect: SqlDialect,
  connection: Connection,
  sql: string,
  params: readonly unknown[],
): Promise<SqlResult<Row>> {
  const values = params.map(asDriverValue);
  if (dialect === 'postgres') {
    return (connection.query(sql, values) as Promise<unknown>).then((result) => pgResultOf<Row>(result));
  }
  if (dialect === 'sqlite') {
    const kind = statementKind(sql);
    return new Promise((resolve, reject) => {
      if (kind === 'count') {
        connection.run(sql, values, function (error) {
          error ? reject(error) : resolve({ rows: [], affected: this.changes });
        });
        return;
      }
      // A RETURNING answers one row per row changed.
      connection.all(sql, values, (error, rows) =>
        error
          ? reject(error)
          : resolve({ rows: rows as Row[], affected: kind === 'returning' ? rows.length : 0 }),
      );
    });
  }
  return new Promise((resolve, reject) => {
    connection.query(sql, values, (error, result) =>
      error ? reject(error) : resolve(mysqlResultOf<Row>([result])),
    );
  });
}

/**
 * A SQL driver over a Sequelize 6 instance (`postgres`; `mysql`, on mysql2, for MySQL or MariaDB;
 * `sqlite`, on the `sqlite3` package): an operation's transaction is a managed `sequelize.transaction()`, whose `Transaction` the handler
 * gets as `ctx.tx` and passes as `{ transaction: ctx.tx }`; a
 * `sequelize.transaction({ transaction: ctx.tx }, …)` it opens nests as a savepoint, the Sequelize
 * way. retrysafe's statements run on the client connection the transaction holds (or one of the
 * pool's), in the client's own placeholders, so that neither Sequelize's rewriting of `$` and `?`
 * nor its result shapes stand between them and the database.
 * @example
 * const sequelize = new Sequelize(process.env.DATABASE_URL);
 * const store = sqlStore(sequelizeDriver(sequelize), { migrate: true });
 */
export function sequelizeDriver(sequelize: Sequelize): SqlDriver<Transaction> {
  const name = typeof sequelize?.getDialect === 'function' ? sequelize.getDialect() : undefined;
  const dialect = name !== undefined && Object.hasOwn(DIALECTS, name) ? DIALECTS[name] : undefined;
  if (!dialect) {
    throw new ConfigError(
      `sequelizeStore: give a Sequelize 6 instance of dialect postgres, mysql (mysql2, for MariaDB too) or sqlite${name ? `; this one's dialect is ${name}` : ''}`,
    );
  }
  const { connectionManager } = sequelize;
  // On SQLite, Sequelize opens a connection per transaction (and one for the rest), each
  // contending for the one writer within node-sqlite3's 1 s busy timeout (and Sequelize's 5
  // retries of a busy BEGIN): taken in turns, none waits on another's lock, and a
  // transaction takes the write lock as it begins (IMMEDIATE) so that one in another process
  // waits for it there rather than failing busy on its first write.
  const sqlite = dialect === 'sqlite';
  const inTurn = sqlite ? oneAtATime(sequelize) : <T>(fn: () => Promise<T>) => fn();
  const transactionOptions = sqlite ? { type: 'IMMEDIATE' as Transaction.TYPES } : {};

  /** One statement on a pool connection of its own, outside any transaction (autocommit). */
  async function query<Row>(sql: string, params: readonly unknown[]): Promise<SqlResult<Row>> {
    const connection = (await connectionManager.getConnection({
      type: 'write',
      useMaster: true,
    })) as Connection;
    try {
      return await runOn<Row>(dialect!, connection, sql, params);
    } finally {
      connectionManager.releaseConnection(connection as never);
    }
  }

  return {
    dialect,
    name: 'sequelize',
    query: (sql, params) => inTurn(() => query(sql, params)),
    transaction: (work) => inTurn(() => sequelize.transaction(transactionOptions, (tx) => work(tx))),
    queryIn(tx, sql, params) {
      const open = tx as unknown as OpenTransaction;
      // A transaction the handler ended through Sequelize (`tx.commit()`, `tx.rollback()`) gave
      // its connection back to the pool: the store's statements run outside, where it sees that
      // the transaction has ended.
      if (open.finished) return query(sql, params);
      if (!open.connection) throw new ConfigError('sequelizeDriver: the transaction holds no connection');
      return runOn(dialect, open.connection, sql, params);
    },
    errorCode: databaseErrorCode,
  };
}

/**
 * A retrysafe store on the PostgreSQL, MySQL, MariaDB or SQLite database a Sequelize 6 instance writes to.
 * In atomic mode a handler's `ctx.tx` is the Sequelize `Transaction` holding the key: the key, the
 * handler's writes with `{ transaction: ctx.tx }` and the saved answer commit together, and
 * `sequelize.transaction({ transaction: ctx.tx }, …)` is a savepoint inside it.
 * @example
 * ```ts
 * import { Sequelize } from 'sequelize';
 * import { sequelizeStore } from 'retrysafe/sequelize';
 * const sequelize = new Sequelize(process.env.DATABASE_URL);
 * const store = sequelizeStore(sequelize, { migrate: true });
 * // in a handler: await Order.create({ item }, { transaction: idem.tx });
 * ```
 */
export function sequelizeStore(sequelize: Sequelize, options?: SqlStoreOptions): SqlStore<Transaction> {
  return sqlStore(sequelizeDriver(sequelize), options);
}
