import { MikroORM } from '@mikro-orm/mysql';
import { describe } from 'vitest';
import { mikroOrmStore } from '../src/stores/sql/drivers/mikro-orm.js';
import { describeMysqlOrmStore } from './conformance/orm-mysql-suite.js';
import { executeIn, openMikroOrm } from './support/mikro-orm.js';
import { hasMysql } from './support/services.js';

type Tx = MikroORM['em'];

describe.skipIf(!hasMysql)('mikro-orm on MariaDB', () => {
  describeMysqlOrmStore<Tx>('mikroOrm', async (url) => {
    const orm = await openMikroOrm((options) => MikroORM.init(options), url);
    return {
      store: (options) => mikroOrmStore(orm, options),
      insert: (tx, table) => executeIn(tx, `INSERT INTO ${table} () VALUES ()`),
      nested: (tx, work) => tx.transactional((inner) => work(inner)),
      rawCommit: (tx) => executeIn(tx, 'COMMIT'),
      close: () => orm.close(),
    };
  });
});
