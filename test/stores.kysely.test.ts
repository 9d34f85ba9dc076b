import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { describe } from 'vitest';
import { kyselyDriver } from '../src/stores/sql/drivers/kysely.js';
import { describeSqlDriverConformance } from './conformance/sql-driver-suite.js';
import { hasPostgres, PG_URL } from './support/services.js';

const openKysely = () =>
  new Kysely<any>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: 4 }) }),
  });

describe.skipIf(!hasPostgres)('kysely', () => {
  describeSqlDriverConformance('kysely', async () => {
    const db = openKysely();
    return {
      driver: kyselyDriver(db),
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
      close: () => db.destroy(),
    };
  });
});
