import { DataSource, type EntityManager } from 'typeorm';
import { describe } from 'vitest';
import { typeormStore } from '../src/stores/sql/drivers/typeorm.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';

describe('typeorm on SQLite (better-sqlite3)', () => {
  describeSqliteOrmStore<EntityManager>(
    'typeorm',
    async (url) => {
      const dataSource = await new DataSource({ type: 'better-sqlite3', database: url }).initialize();
      return {
        store: (options) => typeormStore(dataSource, options),
        insert: (tx, table) => tx.query(`INSERT INTO ${table} DEFAULT VALUES`),
        nested: (tx, work) => tx.transaction((inner) => work(inner)),
        end: {
          commit: (tx) => tx.queryRunner!.commitTransaction(),
          rollback: (tx) => tx.queryRunner!.rollbackTransaction(),
        },
        rawCommit: (tx) => tx.query('COMMIT'),
        close: () => dataSource.destroy(),
      };
    },
    (tx, sql) => tx.query(sql),
  );
});
