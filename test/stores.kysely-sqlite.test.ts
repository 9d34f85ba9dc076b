import Database from 'better-sqlite3';
import { Kysely, SqliteDialect, sql } from 'kysely';
import { describe } from 'vitest';
import { type KyselyTx, kyselyStore } from '../src/stores/sql/drivers/kysely.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';

describe('kysely on SQLite (better-sqlite3)', () => {
  describeSqliteOrmStore<KyselyTx<any>>(
    'kysely',
    async (url) => {
      const db = new Kysely<any>({ dialect: new SqliteDialect({ database: new Database(url) }) });
      return {
        store: (options) => kyselyStore(db, options),
        insert: (tx, table) => sql`INSERT INTO ${sql.raw(table)} DEFAULT VALUES`.execute(tx),
        async nested(tx, work) {
          const inner = await tx.savepoint('nested').execute();
          try {
            await work(inner);
          } catch (error) {
            await inner.rollbackToSavepoint('nested').execute();
            throw error;
          }
          await inner.releaseSavepoint('nested').execute();
        },
        end: { commit: (tx) => tx.commit().execute(), rollback: (tx) => tx.rollback().execute() },
        rawCommit: (tx) => sql`COMMIT`.execute(tx),
        close: () => db.destroy(),
      };
    },
    (tx, text) => sql.raw(text).execute(tx),
  );
});
