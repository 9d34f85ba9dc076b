import { Sequelize, type Transaction } from 'sequelize';
import { describe, expect, it } from 'vitest';
import { sequelizeDriver, sequelizeStore } from '../src/stores/sql/drivers/sequelize.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { hasPostgres, PG_URL } from './support/services.js';

describe.skipIf(!hasPostgres)('sequelize', () => {
  describeOrmStore<Transaction>('sequelize', async () => {
    const sequelize = new Sequelize(PG_URL, { logging: false, pool: { max: 10 } });
    return {
      store: (options) => sequelizeStore(sequelize, options),
      insert: (tx, table) => sequelize.query(`INSERT INTO ${table} DEFAULT VALUES`, { transaction: tx }),
      // Sequelize nests a transaction given a parent transaction as a savepoint.
      nested: (tx, work) => sequelize.transaction({ transaction: tx }, (inner) => work(inner)),
      rawCommit: (tx) => sequelize.query('COMMIT', { transaction: tx }),
      end: { commit: (tx) => tx.commit(), rollback: (tx) => tx.rollback() },
      close: () => sequelize.close(),
    };
  });

  it('refuses a Sequelize on another database, naming its dialect', () => {
    const mssql = { getDialect: () => 'mssql' } as unknown as Sequelize;
    expect(() => sequelizeDriver(mssql)).toThrow(/dialect is mssql/);
    // The `mariadb` dialect's client is not mysql2: MariaDB is reached with `mysql`.
    const mariadb = { getDialect: () => 'mariadb' } as unknown as Sequelize;
    expect(() => sequelizeDriver(mariadb)).toThrow(/mysql \(mysql2, for MariaDB too\)/);
    expect(() => sequelizeStore({} as never)).toThrow(/give a Sequelize 6 instance of dialect/);
  });
});
