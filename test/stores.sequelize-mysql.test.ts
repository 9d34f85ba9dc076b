import { Sequelize, type Transaction } from 'sequelize';
import { describe } from 'vitest';
import { sequelizeStore } from '../src/stores/sql/drivers/sequelize.js';
import { describeMysqlOrmStore } from './conformance/orm-mysql-suite.js';
import { hasMysql } from './support/services.js';

describe.skipIf(!hasMysql)('sequelize on MariaDB', () => {
  describeMysqlOrmStore<Transaction>('sequelize', async (url) => {
    // Sequelize's mysql dialect (mysql2), which turns found rows off: the driver counts matches.
    const sequelize = new Sequelize(url, { logging: false, pool: { max: 10 } });
    return {
      store: (options) => sequelizeStore(sequelize, options),
      insert: (tx, table) => sequelize.query(`INSERT INTO ${table} () VALUES ()`, { transaction: tx }),
      nested: (tx, work) => sequelize.transaction({ transaction: tx }, (inner) => work(inner)),
      end: { commit: (tx) => tx.commit(), rollback: (tx) => tx.rollback() },
      rawCommit: (tx) => sequelize.query('COMMIT', { transaction: tx }),
      close: () => sequelize.close(),
    };
  });
});
