import { MikroORM } from '@mikro-orm/mysql';
import { describe } from 'vitest';
import { mikroOrmStore } from '../src/stores/sql/drivers/mikro-orm.js';
import { describeMysqlOrmStore } from './conformance/orm-mysql-suite.js';
import { openMikroOrm } from './support/mikro-orm.js';
import { hasMysql } from './support/services.js';

type Tx = MikroORM['em'];

describe.skipIf(!hasMysql)('mikro-orm on MariaDB', () => {
  describeMysqlOrmStore<Tx>('mikroOrm', async (url) => {
    const orm = await openMikroOrm((options) => MikroORM.init(options), url);
    const execute = (tx: Tx, sql: string) =>
      tx.getConnection().execute(sql, [], 'run', tx.getTransactionContext());
    return {
      store: (options) => mikroOrmStore(orm, options),
      insert: (tx, table) => execute(tx, `INSERT INTO ${table} () VALUES ()`),
      nested: (tx, work) => tx.transactional((inner) => work(inner)),
      rawCommit: (tx) => execute(tx, 'COMMIT'),
      close: () => orm.close(),
    };
  });
});
