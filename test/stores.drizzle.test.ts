import { sql } from 'drizzle-orm';
import { drizzle, type NodePgDatabase } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { StoredResponse } from '../src/core/contract/index.js';
import { type DrizzleTransaction, drizzleStore } from '../src/stores/sql/drivers/drizzle.js';
import type { SqlStore } from '../src/stores/sql/store.js';
import { describeIdempotentConformance } from './conformance/idempotent-suite.js';
import { describeStoreConformance, type StoreUnderTest } from './conformance/store-suite.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';
import { claimInput, textResponse } from './support/store-calls.js';

type Tx = DrizzleTransaction<NodePgDatabase>;

/** A Drizzle store in a schema of its own, with a table the atomic-mode tests write to through the ORM's tx. */
async function drizzleUnderTest(): Promise<StoreUnderTest> {
  const schema = uniqueName('rs_drizzle');
  const pool = new pg.Pool({ connectionString: PG_URL, max: 10 });
  const db = drizzle(pool);
  const store = drizzleStore(db, { schema, migrate: true });
  await store.migrate();
  await pool.query(`CREATE TABLE "${schema}".probe (id serial PRIMARY KEY)`);
  return {
    store,
    atomicProbe: {
      async write(tx: Tx) {
        await tx.execute(sql.raw(`INSERT INTO "${schema}".probe DEFAULT VALUES`));
      },
      async count() {
        return Number((await pool.query(`SELECT count(*) FROM "${schema}".probe`)).rows[0].count);
      },
      async commit(tx: Tx) {
        await tx.execute(sql.raw('COMMIT'));
      },
    },
    async cleanup() {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await pool.end();
    },
  };
}

describe.skipIf(!hasPostgres)('drizzle (node-postgres)', () => {
  describeStoreConformance('drizzle (lease and atomic mode)', drizzleUnderTest);
  describeIdempotentConformance('drizzle', drizzleUnderTest);
});

describe.skipIf(!hasPostgres)('drizzle: the ORM transaction is the operation transaction', () => {
  const schema = uniqueName('rs_drizzle_tx');
  let pool: pg.Pool;
  let store: SqlStore<Tx>;
  const rows = async () =>
    Number((await pool.query(`SELECT count(*) FROM "${schema}".orders`)).rows[0].count);
  const insert = (tx: Tx) => tx.execute(sql.raw(`INSERT INTO "${schema}".orders DEFAULT VALUES`));
  const answer = (): { response: StoredResponse; commit: boolean } => ({
    response: textResponse('ok'),
    commit: true,
  });

  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: PG_URL, max: 10 });
    store = drizzleStore(drizzle(pool), { schema, migrate: true });
    await store.migrate();
    await pool.query(`CREATE TABLE "${schema}".orders (id serial PRIMARY KEY)`);
  });

  afterAll(async () => {
    await store?.close();
    await pool?.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await pool?.end();
  });

  it("a handler's own tx.transaction() is a savepoint: a throw after it keeps nothing", async () => {
    const before = await rows();
    const input = claimInput('nested-fail');
    await expect(
      store.atomic(input, async (tx) => {
        await tx.transaction(async (nested) => {
          await insert(nested as unknown as Tx);
        });
        throw new Error('after the nested transaction');
      }),
    ).rejects.toThrow('after the nested transaction');
    expect(await rows()).toBe(before);
    expect(await store.get(input.scope, input.key)).toBeUndefined();
  });

  it('a nested transaction that commits its savepoint commits with the key', async () => {
    const before = await rows();
    const input = claimInput('nested-ok');
    const result = await store.atomic(input, async (tx) => {
      await tx.transaction(async (nested) => {
        await insert(nested as unknown as Tx);
      });
      return answer();
    });
    expect(result).toMatchObject({ outcome: 'executed', committed: true });
    expect(await rows()).toBe(before + 1);
    expect(await store.get(input.scope, input.key)).toMatchObject({ state: 'completed', status: 201 });
  });

  it('200 concurrent duplicates write one row', async () => {
    const before = await rows();
    const input = claimInput('hot');
    const results = await Promise.all(
      Array.from({ length: 200 }, () =>
        store.atomic(input, async (tx) => {
          await insert(tx);
          return answer();
        }),
      ),
    );
    expect(results.filter((r) => r.outcome === 'executed')).toHaveLength(1);
    expect(await rows()).toBe(before + 1);
  });

  it('without migrate, a missing table is a ConfigError naming the fix', async () => {
    const bare = drizzleStore(drizzle(pool), { schema: `${schema}_none` });
    await expect(bare.claim(claimInput('x'))).rejects.toThrow(/does not exist.*migrate: true/s);
    await expect(bare.atomic(claimInput('y'), async () => answer())).rejects.toThrow(/does not exist/);
  });
});
