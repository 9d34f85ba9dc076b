import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { describe } from 'vitest';
import { type KyselyTx, kyselyStore } from '../src/stores/sql/drivers/kysely.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { hasPostgres, PG_URL } from './support/services.js';

describe.skipIf(!hasPostgres)('kysely', () => {
  describeOrmStore<KyselyTx<any>>('kysely', async () => {
    const db = new Kysely<any>({
      dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: 10 }) }),
    });
    return {
      store: (options) => kyselyStore(db, options),
      insert: (tx, table) => sql`INSERT INTO ${sql.raw(table)} DEFAULT VALUES`.execute(tx),
      // Kysely nests with a savepoint on its controlled transaction.
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
      rawCommit: (tx) => sql`COMMIT`.execute(tx),
      close: () => db.destroy(),
    };
  });
});
