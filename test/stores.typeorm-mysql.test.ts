import { DataSource, type EntityManager } from 'typeorm';
import { describe } from 'vitest';
import { typeormStore } from '../src/stores/sql/drivers/typeorm.js';
import { describeMysqlOrmStore } from './conformance/orm-mysql-suite.js';
import { hasMysql } from './support/services.js';

describe.skipIf(!hasMysql)('typeorm on MariaDB', () => {
  describeMysqlOrmStore<EntityManager>('typeorm', async (url) => {
    const dataSource = await new DataSource({ type: 'mariadb', url, poolSize: 10 }).initialize();
    return {
      store: (options) => typeormStore(dataSource, options),
      insert: (tx, table) => tx.query(`INSERT INTO ${table} () VALUES ()`),
      // TypeORM nests a transaction on a transaction's manager as a savepoint.
      nested: (tx, work) => tx.transaction((inner) => work(inner)),
      end: {
        commit: (tx) => tx.queryRunner!.commitTransaction(),
        rollback: (tx) => tx.queryRunner!.rollbackTransaction(),
      },
      rawCommit: (tx) => tx.query('COMMIT'),
      close: () => dataSource.destroy(),
    };
  });
});
