import { sql } from 'drizzle-orm';
import { drizzle, type NodePgDatabase } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { describe } from 'vitest';
import { type DrizzleTransaction, drizzleStore } from '../src/stores/sql/drivers/drizzle.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { hasPostgres, PG_URL } from './support/services.js';

type Tx = DrizzleTransaction<NodePgDatabase>;

describe.skipIf(!hasPostgres)('drizzle (node-postgres)', () => {
  describeOrmStore<Tx>('drizzle', async () => {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 10 });
    const db = drizzle(pool);
    return {
      store: (options) => drizzleStore(db, options),
      insert: (tx, table) => tx.execute(sql.raw(`INSERT INTO ${table} DEFAULT VALUES`)),
      // Drizzle nests a transaction on a transaction as a savepoint.
      nested: (tx, work) => tx.transaction((inner) => work(inner as unknown as Tx)),
      rawCommit: (tx) => tx.execute(sql.raw('COMMIT')),
      close: () => pool.end(),
    };
  });
});
