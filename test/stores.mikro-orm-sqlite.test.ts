import { MikroORM } from '@mikro-orm/better-sqlite';
import { describe } from 'vitest';
import { mikroOrmStore } from '../src/stores/sql/drivers/mikro-orm.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';

type Tx = MikroORM['em'];

const execute = (tx: Tx, sql: string) =>
  tx.getConnection().execute(sql, [], 'run', tx.getTransactionContext());

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
        insert: (tx, table) => execute(tx, `INSERT INTO ${table} DEFAULT VALUES`),
        nested: (tx, work) => tx.transactional((inner) => work(inner)),
        rawCommit: (tx) => execute(tx, 'COMMIT'),
        close: () => orm.close(),
      };
    },
    execute,
  );
});
