import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isTransactionEnded, type StoredResponse } from '../../src/core/contract/index.js';
import type { SqlStore, SqlStoreOptions } from '../../src/stores/sql/store.js';
import { PG_URL, uniqueName } from '../support/services.js';
import { claimInput, textResponse } from '../support/store-calls.js';
import { describeIdempotentConformance } from './idempotent-suite.js';
import { describeSqlDriverConformance } from './sql-driver-suite.js';
import { describeStoreConformance, type StoreUnderTest } from './store-suite.js';

/** An ORM on the test PostgreSQL, as its retrysafe binding uses it. */
export interface OrmUnderTest<Tx> {
  /** The ORM's store (`<orm>Store(db, options)`). */
  store(options: SqlStoreOptions): SqlStore<Tx>;
  /** Inserts a row into `table` (`"schema".name`, one serial column) through the ORM on `tx`. */
  insert(tx: Tx, table: string): Promise<unknown>;
  /** Runs `work` in the ORM's own nested transaction on `tx` (a savepoint the ORM's way). */
  nested(tx: Tx, work: (inner: Tx) => Promise<void>): Promise<void>;
  /** Sends a raw `COMMIT` on `tx` through the ORM, as a careless handler might (the conformance suite's raw-COMMIT tests). */
  rawCommit(tx: Tx): Promise<unknown>;
  /** Closes the ORM's connections. */
  close(): Promise<void>;
  /**
   * Ends `tx` through the ORM's own API rather than raw SQL, where the ORM has one: Kysely's
   * `tx.commit()`, Knex's `trx.commit()`, TypeORM's query runner's `commitTransaction()`.
   */
  end?: { commit(tx: Tx): Promise<unknown>; rollback(tx: Tx): Promise<unknown> };
}

/**
 * An ORM binding's whole check on PostgreSQL: its driver against the seam, its store against the
 * store and `idempotent()` conformance suites with an atomic probe writing through the ORM's
 * transaction (which ends it with a raw COMMIT for the raw-COMMIT tests), and atomic mode with the
 * ORM's own nested transaction, 200 concurrent duplicates and a missing table. `open` makes a
 * fresh ORM instance each time it is called.
 */
export function describeOrmStore<Tx>(
  name: string,
  open: () => Promise<OrmUnderTest<Tx>>,
  quirks: { selectCountsRows?: boolean } = {},
): void {
  describeSqlDriverConformance<Tx>(name, async () => {
    const orm = await open();
    return { driver: orm.store({}).driver, nested: orm.nested, close: orm.close, ...quirks };
  });

  const underTest = async (): Promise<StoreUnderTest> => {
    const schema = uniqueName(`rs_${name}`);
    const orm = await open();
    const admin = new pg.Pool({ connectionString: PG_URL, max: 2 });
    const store = orm.store({ schema, migrate: true });
    await store.migrate();
    await admin.query(`CREATE TABLE "${schema}".probe (id serial PRIMARY KEY)`);
    return {
      store,
      atomicProbe: {
        async write(tx: Tx) {
          await orm.insert(tx, `"${schema}".probe`);
        },
        async commit(tx: Tx) {
          await orm.rawCommit(tx);
        },
        async count() {
          return Number((await admin.query(`SELECT count(*) FROM "${schema}".probe`)).rows[0].count);
        },
      },
      async cleanup() {
        await orm.close();
        await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
        await admin.end();
      },
    };
  };
  describeStoreConformance(`${name} (lease and atomic mode)`, underTest);
  describeIdempotentConformance(name, underTest);

  describe(`${name}: the ORM's transaction is the operation's transaction`, () => {
    const schema = uniqueName(`rs_${name}_tx`);
    const orders = `"${schema}".orders`;
    let orm: OrmUnderTest<Tx>;
    let admin: pg.Pool;
    let store: SqlStore<Tx>;
    const rows = async () => Number((await admin.query(`SELECT count(*) FROM ${orders}`)).rows[0].count);
    const answer = (): { response: StoredResponse; commit: boolean } => ({
      response: textResponse('ok'),
      commit: true,
    });

    beforeAll(async () => {
      orm = await open();
      admin = new pg.Pool({ connectionString: PG_URL, max: 2 });
      store = orm.store({ schema, migrate: true });
      await store.migrate();
      await admin.query(`CREATE TABLE ${orders} (id serial PRIMARY KEY)`);
    });
    afterAll(async () => {
      await store?.close();
      await orm?.close();
      await admin?.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await admin?.end();
    });

    it("the handler's own nested transaction commits its savepoint, then the handler throws: nothing is kept", async () => {
      const before = await rows();
      const input = claimInput('nested-fail');
      await expect(
        store.atomic(input, async (tx) => {
          await orm.nested(tx, (inner) => orm.insert(inner, orders).then(() => {}));
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
        await orm.nested(tx, (inner) => orm.insert(inner, orders).then(() => {}));
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
            await orm.insert(tx, orders);
            return answer();
          }),
        ),
      );
      expect(results.filter((result) => result.outcome === 'executed')).toHaveLength(1);
      expect(await rows()).toBe(before + 1);
    });

    const endingThrough = (how: 'commit' | 'rollback', counter: { runs: number }) => async (tx: Tx) => {
      counter.runs++;
      await orm.insert(tx, orders);
      await orm.end![how](tx);
      return answer();
    };

    it("the handler commits through the ORM's own API: caught as a raw COMMIT is, and the write never runs again", async (context) => {
      if (!orm.end) return context.skip('the ORM has no API to end its transaction');
      const before = await rows();
      const input = claimInput('own-commit');
      const counter = { runs: 0 };
      const failure = await store
        .atomic(input, endingThrough('commit', counter))
        .catch((error: unknown) => error);
      expect(isTransactionEnded(failure)).toBe(true);
      expect(await rows()).toBe(before + 1);
      expect(await store.atomic(input, endingThrough('commit', counter))).toMatchObject({
        outcome: 'replay',
        response: { status: 500 },
      });
      expect(counter.runs).toBe(1);
      expect(await rows()).toBe(before + 1);
    });

    it("the handler rolls back through the ORM's own API: caught too; nothing is kept, and the key is free", async (context) => {
      if (!orm.end) return context.skip('the ORM has no API to end its transaction');
      const before = await rows();
      const input = claimInput('own-rollback');
      const counter = { runs: 0 };
      const failure = await store
        .atomic(input, endingThrough('rollback', counter))
        .catch((error: unknown) => error);
      expect(isTransactionEnded(failure)).toBe(true);
      expect(await rows()).toBe(before);
      expect(await store.get(input.scope, input.key)).toBeUndefined();
    });

    it('without migrate, a missing table is a ConfigError naming the fix', async () => {
      const bare = orm.store({ schema: `${schema}_none` });
      await expect(bare.claim(claimInput('x'))).rejects.toThrow(/does not exist.*migrate: true/s);
      await expect(bare.atomic(claimInput('y'), async () => answer())).rejects.toThrow(/does not exist/);
    });
  });
}
