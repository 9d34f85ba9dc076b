import { MikroORM } from '@mikro-orm/better-sqlite';
import { describe } from 'vitest';
import { mikroOrmStore } from '../src/stores/sql/drivers/mikro-orm.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';
import { executeIn } from './support/mikro-orm.js';

type Tx = MikroORM['em'];

describe('mikro-orm on SQLite (@mikro-orm/better-sqlite)', () => {
  describeSqliteOrmStore<Tx>(
    'mikroOrm',
    async (url) => {
      const orm = await MikroORM.init({
        dbName: url,
        entities: [],
        discovery: { warnWhenNoEntities: false },
      });
      return {
        store: (options) => mikroOrmStore(orm, options),
        insert: (tx, table) => executeIn(tx, `INSERT INTO ${table} DEFAULT VALUES`),
        nested: (tx, work) => tx.transactional((inner) => work(inner)),
        rawCommit: (tx) => executeIn(tx, 'COMMIT'),
        close: () => orm.close(),
      };
    },
    executeIn,
  );
});
