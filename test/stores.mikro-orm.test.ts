import { MikroORM } from '@mikro-orm/postgresql';
import { describe, expect, it } from 'vitest';
import { mikroOrmStore } from '../src/stores/sql/drivers/mikro-orm.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { executeIn, openMikroOrm } from './support/mikro-orm.js';
import { hasPostgres, PG_URL } from './support/services.js';

type Tx = MikroORM['em'];

describe.skipIf(!hasPostgres)('mikro-orm', () => {
  describeOrmStore<Tx>('mikroOrm', async () => {
    const orm = await openMikroOrm((options) => MikroORM.init(options), PG_URL);
    return {
      store: (options) => mikroOrmStore(orm, options),
      insert: (tx, table) => executeIn(tx, `INSERT INTO ${table} DEFAULT VALUES`),
      // MikroORM nests a transaction on a transaction's EntityManager as a savepoint.
      nested: (tx, work) => tx.transactional((inner) => work(inner)),
      rawCommit: (tx) => executeIn(tx, 'COMMIT'),
      close: () => orm.close(),
    };
  });

  it('refuses what is no MikroORM of a SQL driver', () => {
    expect(() => mikroOrmStore({} as never)).toThrow(/give a MikroORM instance/);
  });
});
