import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isTransactionEnded, type StoredResponse } from '../../src/core/contract/index.js';
import type { SqlStore, SqlStoreOptions } from '../../src/stores/sql/store.js';
import { describeIdempotentConformance } from '../../src/testing/idempotent-suite.js';
import { describeStoreConformance, type StoreUnderTest } from '../../src/testing/store-suite.js';
import { claimInput, textResponse } from '../support/store-calls.js';

/** An ORM on a database of the test server, as its retrysafe binding uses it. */
export interface OrmUnderTest<Tx> {
  /** The ORM's store (`<orm>Store(db, options)`). */
  store(options: SqlStoreOptions): SqlStore<Tx>;
  /** Inserts a row into `table` (as `Place.table` names it, one serial column) through the ORM on `tx`. */
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

/** A fresh place of its own on the database under test: a PostgreSQL schema, a MariaDB database. */
export interface Place {
  /** The URL the ORM opens. */
  url: string;
  /** What the store gets to keep its table in this place. */
  options: SqlStoreOptions;
  /** Options naming a table that does not exist. */
  missing: SqlStoreOptions;
  /** `name` as the ORM's `insert` writes to it. */
  table(name: string): string;
  /** Creates `name` with one serial column. */
  createTable(name: string): Promise<void>;
  /** Counts the rows of `name`, outside any operation. */
  count(name: string): Promise<number>;
  /** Drops the place and all in it, and closes the admin connections. */
  drop(): Promise<void>;
}

/** The database the ORMs run on. */
export interface DatabaseUnderTest {
  /** Appended to the ORM's name in the suites' names (`' on MariaDB'`). */
  suffix: string;
  fresh(): Promise<Place>;
  /**
   * Whether the transaction tests migrate the store's table up front; MariaDB leaves it to first
   * use, which its own tests check.
   */
  migrateUpFront: boolean;
}

/** What the transaction tests share with a database's own tests, set before they run. */
export interface OrmTransactionContext<Tx> {
  orm: OrmUnderTest<Tx>;
  place: Place;
  store: SqlStore<Tx>;
  /** `orders`, as the ORM writes to it. */
  orders: string;
  rows(): Promise<number>;
  answer(): { response: StoredResponse; commit: boolean };
}

/**
 * An ORM binding's check on a database: its store against the store and `idempotent()`
 * conformance suites with an atomic probe writing through the ORM's transaction (which ends it
 * with a raw COMMIT for the raw-COMMIT tests), and atomic mode with the ORM's own nested
 * transaction, its own commit and rollback, 200 concurrent duplicates and a missing table.
 * `ownTests` adds the database's own tests to the transaction tests, before the shared ones.
 * `open` makes a fresh ORM instance on `url` each time it is called.
 */
export function describeOrmConformance<Tx>(
  name: string,
  database: DatabaseUnderTest,
  open: (url: string) => Promise<OrmUnderTest<Tx>>,
  ownTests: (context: OrmTransactionContext<Tx>) => void = () => {},
): void {
  const named = `${name}${database.suffix}`;

  const underTest = async (): Promise<StoreUnderTest> => {
    const place = await database.fresh();
    const orm = await open(place.url);
    const store = orm.store({ ...place.options, migrate: true });
    await store.migrate();
    await place.createTable('probe');
    return {
      store,
      atomicProbe: {
        async write(tx: Tx) {
          await orm.insert(tx, place.table('probe'));
        },
        async commit(tx: Tx) {
          await orm.rawCommit(tx);
        },
        count: () => place.count('probe'),
      },
      async cleanup() {
        await orm.close();
        await place.drop();
      },
    };
  };
  describeStoreConformance(`${named} (lease and atomic mode)`, underTest);
  describeIdempotentConformance(named, underTest);

  describe(`${named}: the ORM's transaction is the operation's transaction`, () => {
    const context = {
      rows: () => context.place.count('orders'),
      answer: () => ({ response: textResponse('ok'), commit: true }),
    } as OrmTransactionContext<Tx>;

    beforeAll(async () => {
      context.place = await database.fresh();
      context.orders = context.place.table('orders');
      context.orm = await open(context.place.url);
      context.store = context.orm.store({ ...context.place.options, migrate: true });
      if (database.migrateUpFront) await context.store.migrate();
      await context.place.createTable('orders');
    });
    afterAll(async () => {
      await context.store?.close();
      await context.orm?.close();
      await context.place?.drop();
    });

    ownTests(context);
    const { rows, answer } = context;

    it("the handler's own nested transaction commits its savepoint, then the handler throws: nothing is kept", async () => {
      const { orm, store, orders } = context;
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
      const { orm, store, orders } = context;
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
      const { orm, store, orders } = context;
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
      await context.orm.insert(tx, context.orders);
      await context.orm.end![how](tx);
      return answer();
    };

    it("the handler commits through the ORM's own API: caught as a raw COMMIT is, and the write never runs again", async (test) => {
      const { orm, store } = context;
      if (!orm.end) return test.skip('the ORM has no API to end its transaction');
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

    it("the handler rolls back through the ORM's own API: caught too; nothing is kept, and the key is free", async (test) => {
      const { orm, store } = context;
      if (!orm.end) return test.skip('the ORM has no API to end its transaction');
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
      const bare = context.orm.store(context.place.missing);
      await expect(bare.claim(claimInput('x'))).rejects.toThrow(/does not exist.*migrate: true/s);
      await expect(bare.atomic(claimInput('y'), async () => answer())).rejects.toThrow(/does not exist/);
    });
  });
}
