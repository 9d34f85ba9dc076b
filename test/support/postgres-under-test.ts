import pg from 'pg';
import { type PostgresStoreOptions, postgresStore } from '../../src/stores/postgres/index.js';
import type { StoreUnderTest } from '../../src/testing/store-suite.js';
import { PG_URL, uniqueName } from './services.js';

/**
 * A PostgreSQL store in a schema of its own (`url` defaults to the test server), with
 * a table for the atomic-mode tests to write to; `cleanup` drops the schema, then runs `after`.
 */
export async function postgresUnderTest(
  options: Partial<PostgresStoreOptions> = {},
  after?: () => Promise<void>,
): Promise<StoreUnderTest> {
  const schema = uniqueName('rs_pg_conf');
  const admin = new pg.Pool({ connectionString: PG_URL, max: 2 });
  const store = postgresStore({ url: PG_URL, ...options, schema });
  await store.migrate();
  await admin.query(`CREATE TABLE "${schema}".probe (id serial PRIMARY KEY)`);
  return {
    store,
    atomicProbe: {
      async write(tx: pg.PoolClient) {
        await tx.query(`INSERT INTO "${schema}".probe DEFAULT VALUES`);
      },
      async count() {
        return Number((await admin.query(`SELECT count(*) FROM "${schema}".probe`)).rows[0].count);
      },
      async commit(tx: pg.PoolClient) {
        await tx.query('COMMIT');
      },
    },
    async cleanup() {
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await admin.end();
      await after?.();
    },
  };
}
