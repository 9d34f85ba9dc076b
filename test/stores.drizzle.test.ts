import { sql } from 'drizzle-orm';
import { drizzle, type NodePgDatabase } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { type DrizzleTransaction, drizzleStore } from '../src/stores/sql/drivers/drizzle.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { hasPostgres, PG_URL } from './support/services.js';
import { claimInput } from './support/store-calls.js';

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

  it('without migrate, a missing table is a ConfigError naming the fix, in lease and atomic mode', async () => {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
    try {
      const bare = drizzleStore(drizzle(pool), { schema: 'rs_drizzle_none' });
      await expect(bare.claim(claimInput('x'))).rejects.toThrow(/does not exist.*migrate: true/s);
      await expect(
        bare.atomic(claimInput('y'), async () => ({
          response: { status: 201, headers: {}, body: new Uint8Array() },
          commit: true,
        })),
      ).rejects.toThrow(/does not exist/);
    } finally {
      await pool.end();
    }
  });
});
