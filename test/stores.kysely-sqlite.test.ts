import Database from 'better-sqlite3';
import { Kysely, SqliteDialect, sql } from 'kysely';
import { describe } from 'vitest';
import { type KyselyTx, kyselyStore } from '../src/stores/sql/drivers/kysely.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';
import { kyselyNested } from './support/kysely.js';

describe('kysely on SQLite (better-sqlite3)', () => {
  describeSqliteOrmStore<KyselyTx<any>>(
    'kysely',
    async (url) => {
      const db = new Kysely<any>({ dialect: new SqliteDialect({ database: new Database(url) }) });
      return {
        store: (options) => kyselyStore(db, options),
        insert: (tx, table) => sql`INSERT INTO ${sql.raw(table)} DEFAULT VALUES`.execute(tx),
        nested: kyselyNested,
        end: { commit: (tx) => tx.commit().execute(), rollback: (tx) => tx.rollback().execute() },
        rawCommit: (tx) => sql`COMMIT`.execute(tx),
        close: () => db.destroy(),
      };
    },
    (tx, text) => sql.raw(text).execute(tx),
  );
});
