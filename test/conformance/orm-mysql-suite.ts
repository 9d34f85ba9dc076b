import mysql from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isTransactionEnded, type StoredResponse } from '../../src/core/contract/index.js';
import type { SqlStore, SqlStoreOptions } from '../../src/stores/sql/store.js';
import { mysqlDatabase } from '../support/services.js';
import { claimInput, textResponse } from '../support/store-calls.js';
import { describeIdempotentConformance } from './idempotent-suite.js';
import { describeStoreConformance, type StoreUnderTest } from './store-suite.js';

/** An ORM on a database of the test MariaDB, as its retrysafe binding uses it. */
export interface MysqlOrmUnderTest<Tx> {
  /** The ORM's store (`<orm>Store(db, options)`). */
  store(options: SqlStoreOptions): SqlStore<Tx>;
  /** Inserts a row into `table` (one AUTO_INCREMENT column) through the ORM on `tx`. */
  insert(tx: Tx, table: string): Promise<unknown>;
  /** Runs `work` in the ORM's own nested transaction on `tx` (a savepoint the ORM's way). */
  nested(tx: Tx, work: (inner: Tx) => Promise<void>): Promise<void>;
  /** Sends a raw `COMMIT` on `tx` through the ORM, as a careless handler might. */
  rawCommit(tx: Tx): Promise<unknown>;
  /** Closes the ORM's connections. */
  close(): Promise<void>;
  /** Ends `tx` through the ORM's own API rather than raw SQL, where the ORM has one. */
  end?: { commit(tx: Tx): Promise<unknown>; rollback(tx: Tx): Promise<unknown> };
}

/**
 * An ORM binding's check on MySQL/MariaDB: its store against the store and `idempotent()`
 * conformance suites with an atomic probe writing through the ORM's transaction, and atomic mode
 * with the ORM's own habits (a nested transaction, a raw COMMIT, 200 concurrent duplicates).
 * `open` makes a fresh ORM instance on the database at `url` each time it is called.
 */
export function describeMysqlOrmStore<Tx>(
  name: string,
  open: (url: string) => Promise<MysqlOrmUnderTest<Tx>>,
): void {
  const underTest = async (): Promise<StoreUnderTest> => {
    const database = await mysqlDatabase();
    const orm = await open(database.url);
    const admin = mysql.createPool({ uri: database.url, connectionLimit: 2 });
    const store = orm.store({ migrate: true });
    await store.migrate();
    await admin.query('CREATE TABLE probe (id int AUTO_INCREMENT PRIMARY KEY)');
    return {
      store,
      atomicProbe: {
        async write(tx: Tx) {
          await orm.insert(tx, 'probe');
        },
        async commit(tx: Tx) {
          await orm.rawCommit(tx);
        },
        async count() {
          const [rows] = await admin.query<mysql.RowDataPacket[]>('SELECT count(*) AS n FROM probe');
          return Number(rows[0]!.n);
        },
      },
      async cleanup() {
        await orm.close();
        await admin.end();
        await database.drop();
      },
    };
  };
  describeStoreConformance(`${name} on MariaDB (lease and atomic mode)`, underTest);
  describeIdempotentConformance(`${name} on MariaDB`, underTest);

  describe(`${name} on MariaDB: the ORM's transaction is the operation's transaction`, () => {
    let database: Awaited<ReturnType<typeof mysqlDatabase>>;
    let orm: MysqlOrmUnderTest<Tx>;
    let admin: mysql.Pool;
    let store: SqlStore<Tx>;
    const rows = async () => {
      const [found] = await admin.query<mysql.RowDataPacket[]>('SELECT count(*) AS n FROM orders');
      return Number(found[0]!.n);
    };
    const answer = (): { response: StoredResponse; commit: boolean } => ({
      response: textResponse('ok'),
      commit: true,
    });

    beforeAll(async () => {
      database = await mysqlDatabase();
      orm = await open(database.url);
      admin = mysql.createPool({ uri: database.url, connectionLimit: 2 });
      store = orm.store({ migrate: true });
      await admin.query('CREATE TABLE orders (id int AUTO_INCREMENT PRIMARY KEY)');
    });
    afterAll(async () => {
      await store?.close();
      await orm?.close();
      await admin?.end();
      await database?.drop();
    });

    it('speaks the MySQL dialect; `schema` is refused', () => {
      expect(store.driver.dialect).toBe('mysql');
      expect(() => orm.store({ schema: 'x' })).toThrow(/`schema` is PostgreSQL's/);
    });

    it("surfaces the server's ER_ codes and mysql2's affected counts", async () => {
      const { driver } = store;
      const missing = await driver.query('SELECT 1 FROM no_such_table', []).catch((error: unknown) => error);
      expect(driver.errorCode(missing)).toBe('ER_NO_SUCH_TABLE');
      await driver.query('CREATE TABLE counts (k varchar(8) PRIMARY KEY, n int, b longblob)', []);
      const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
      const inserted = await driver.query('INSERT INTO counts (k, n, b) VALUES (?, 1, ?), (?, 2, ?)', [
        'a',
        bytes,
        'b',
        Buffer.from(bytes),
      ]);
      expect(inserted.affected).toBe(2);
      expect((await driver.query('UPDATE counts SET n = ? WHERE n >= ?', [5, 1])).affected).toBe(2);
      // Found rows, not changed ones: the store's fencing counts matches.
      expect((await driver.query('UPDATE counts SET n = ? WHERE k = ?', [5, 'a'])).affected).toBe(1);
      expect((await driver.query('DELETE FROM counts WHERE k = ?', ['none'])).affected).toBe(0);
      const selected = await driver.query<{ k: string; b: Uint8Array }>(
        'SELECT k, b FROM counts ORDER BY k',
        [],
      );
      expect(selected.affected).toBe(0);
      for (const row of selected.rows) {
        expect(row.b).toBeInstanceOf(Uint8Array);
        expect(Buffer.from(row.b).equals(Buffer.from(bytes)), row.k).toBe(true);
      }
    });

    it('creates its table on first use in atomic mode, outside the operation, and commits the work with the key', async () => {
      const before = await rows();
      const input = claimInput('first-use');
      const result = await store.atomic(input, async (tx) => {
        await orm.insert(tx, 'orders');
        return answer();
      });
      expect(result).toMatchObject({ outcome: 'executed', committed: true });
      expect(await rows()).toBe(before + 1);
      expect(await store.get(input.scope, input.key)).toMatchObject({ state: 'completed', status: 201 });
    });

    it("the handler's own nested transaction commits its savepoint, then the handler throws: nothing is kept", async () => {
      const before = await rows();
      const input = claimInput('nested-fail');
      await expect(
        store.atomic(input, async (tx) => {
          await orm.nested(tx, (inner) => orm.insert(inner, 'orders').then(() => {}));
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
        await orm.nested(tx, (inner) => orm.insert(inner, 'orders').then(() => {}));
        return answer();
      });
      expect(result).toMatchObject({ outcome: 'executed', committed: true });
      expect(await rows()).toBe(before + 1);
    });

    for (const ending of ['returns', 'throws'] as const) {
      it(`a raw COMMIT through the ORM, then the handler ${ending}: caught, and the key never runs again`, async () => {
        const before = await rows();
        const input = claimInput(`raw-commit-${ending}`);
        let runs = 0;
        const work = async (tx: Tx) => {
          runs++;
          await orm.insert(tx, 'orders');
          await orm.rawCommit(tx);
          if (ending === 'throws') throw new Error('after its own commit');
          return answer();
        };
        const failure = await store.atomic(input, work).catch((error: unknown) => error);
        expect(isTransactionEnded(failure)).toBe(true);
        expect(await rows()).toBe(before + 1);
        expect(await store.atomic(input, work)).toMatchObject({
          outcome: 'replay',
          response: { status: 500 },
        });
        expect(runs).toBe(1);
        expect(await rows()).toBe(before + 1);
      });
    }

    it("a duplicate from another process waits at most its waitMs on the record's lock; the handler runs unbounded", async () => {
      const other = await open(database.url);
      const elsewhere = other.store({});
      try {
        const input = { ...claimInput('held'), waitMs: 1000 };
        const [{ bound }] = (
          await admin.query<mysql.RowDataPacket[]>('SELECT @@GLOBAL.innodb_lock_wait_timeout AS bound')
        )[0] as [{ bound: number }];
        let release!: () => void;
        const holding = new Promise<void>((resolve) => (release = resolve));
        let claimed!: () => void;
        const held = new Promise<void>((resolve) => (claimed = resolve));
        let seen: unknown;
        const first = store.atomic(input, async (tx) => {
          const { rows } = await store.driver.queryIn<{ bound: unknown }>(
            tx,
            'SELECT @@SESSION.innodb_lock_wait_timeout AS bound',
            [],
          );
          seen = rows[0]?.bound;
          claimed();
          await holding;
          return answer();
        });
        await held;
        const blocked = await elsewhere.atomic(input, async () => {
          throw new Error('the duplicate must not run');
        });
        expect(blocked).toEqual({ outcome: 'in_progress', retryAfterMs: 1000 });
        release();
        expect(await first).toMatchObject({ outcome: 'executed', committed: true });
        expect(Number(seen)).toBe(Number(bound));
        expect(await elsewhere.atomic(input, async () => answer())).toMatchObject({ outcome: 'replay' });
      } finally {
        await elsewhere.close();
        await other.close();
      }
    });

    const endingThrough = (how: 'commit' | 'rollback', counter: { runs: number }) => async (tx: Tx) => {
      counter.runs++;
      await orm.insert(tx, 'orders');
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
      const bare = orm.store({ table: 'none_here' });
      await expect(bare.claim(claimInput('x'))).rejects.toThrow(/does not exist.*migrate: true/s);
      await expect(bare.atomic(claimInput('y'), async () => answer())).rejects.toThrow(/does not exist/);
    });

    it('200 concurrent duplicates write one row', async () => {
      const before = await rows();
      const input = claimInput('hot');
      const results = await Promise.all(
        Array.from({ length: 200 }, () =>
          store.atomic(input, async (tx) => {
            await orm.insert(tx, 'orders');
            return answer();
          }),
        ),
      );
      expect(results.filter((result) => result.outcome === 'executed')).toHaveLength(1);
      expect(await rows()).toBe(before + 1);
    });
  });
}
