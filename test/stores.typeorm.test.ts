import { DataSource, type EntityManager } from 'typeorm';
import { describe, expect, it } from 'vitest';
import { typeormDriver, typeormStore } from '../src/stores/sql/drivers/typeorm.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { hasPostgres, PG_URL } from './support/services.js';

describe.skipIf(!hasPostgres)('typeorm', () => {
  describeOrmStore<EntityManager>(
    'typeorm',
    async () => {
      const dataSource = await new DataSource({ type: 'postgres', url: PG_URL, poolSize: 10 }).initialize();
      return {
        store: (options) => typeormStore(dataSource, options),
        insert: (tx, table) => tx.query(`INSERT INTO ${table} DEFAULT VALUES`),
        // TypeORM nests a transaction on a transaction's manager as a savepoint.
        nested: (tx, work) => tx.transaction((inner) => work(inner)),
        rawCommit: (tx) => tx.query('COMMIT'),
        end: {
          commit: (tx) => tx.queryRunner!.commitTransaction(),
          rollback: (tx) => tx.queryRunner!.rollbackTransaction(),
        },
        close: () => dataSource.destroy(),
      };
    },
    { selectCountsRows: true },
  );

  it('refuses a DataSource on a database it does not speak to, naming its type', () => {
    const sqljs = { options: { type: 'sqljs' } } as unknown as DataSource;
    expect(() => typeormDriver(sqljs)).toThrow(/type is sqljs/);
  });
});
