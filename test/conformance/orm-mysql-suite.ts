import mysql from 'mysql2/promise';
import { expect, it } from 'vitest';
import { isTransactionEnded } from '../../src/core/contract/index.js';
import { mysqlDatabase } from '../support/services.js';
import { claimInput } from '../support/store-calls.js';
import { type DatabaseUnderTest, describeOrmConformance, type OrmUnderTest } from './orm-suite.js';

/** An ORM on a database of the test MariaDB, as its retrysafe binding uses it. */
export type MysqlOrmUnderTest<Tx> = OrmUnderTest<Tx>;

/** The test MariaDB: each place is a database of its own. */
const mariadb: DatabaseUnderTest = {
  suffix: ' on MariaDB',
  migrateUpFront: false,
  async fresh() {
    const database = await mysqlDatabase();
    const admin = mysql.createPool({ uri: database.url, connectionLimit: 2 });
    return {
      url: database.url,
      options: {},
      missing: { table: 'none_here' },
      table: (name) => name,
      async createTable(name) {
        await admin.query(`CREATE TABLE ${name} (id int AUTO_INCREMENT PRIMARY KEY)`);
      },
      async count(name) {
        const [rows] = await admin.query<mysql.RowDataPacket[]>(`SELECT count(*) AS n FROM ${name}`);
        return Number(rows[0]!.n);
      },
      async drop() {
        await admin.end();
        await database.drop();
      },
    };
  },
};

/**
 * An ORM binding's check on MySQL/MariaDB: the ORM conformance suite (`describeOrmConformance`)
 * and MariaDB's own: the dialect, the server's error codes, the migration on first use outside
 * the operation, a raw COMMIT through the ORM, and the bound on a duplicate's lock wait.
 * `open` makes a fresh ORM instance on the database at `url` each time it is called.
 */
export function describeMysqlOrmStore<Tx>(
  name: string,
  open: (url: string) => Promise<MysqlOrmUnderTest<Tx>>,
): void {
  describeOrmConformance(name, mariadb, open, (context) => {
    const { rows, answer } = context;

    it('speaks the MySQL dialect; `schema` is refused', () => {
      const { orm, store } = context;
      expect(store.driver.dialect).toBe('mysql');
      expect(() => orm.store({ schema: 'x' })).toThrow(/`schema` is PostgreSQL's/);
    });

    it("surfaces the server's ER_ codes and mysql2's affected counts", async () => {
      const { driver } = context.store;
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
      const { orm, store, orders } = context;
      const before = await rows();
      const input = claimInput('first-use');
      const result = await store.atomic(input, async (tx) => {
        await orm.insert(tx, orders);
        return answer();
      });
      expect(result).toMatchObject({ outcome: 'executed', committed: true });
      expect(await rows()).toBe(before + 1);
      expect(await store.get(input.scope, input.key)).toMatchObject({ state: 'completed', status: 201 });
    });

    for (const ending of ['returns', 'throws'] as const) {
      it(`a raw COMMIT through the ORM, then the handler ${ending}: caught, and the key never runs again`, async () => {
        const { orm, store, orders } = context;
        const before = await rows();
        const input = claimInput(`raw-commit-${ending}`);
        let runs = 0;
        const work = async (tx: Tx) => {
          runs++;
          await orm.insert(tx, orders);
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
      const { store } = context;
      const other = await open(context.place.url);
      const elsewhere = other.store({});
      try {
        const input = { ...claimInput('held'), waitMs: 1000 };
        const [{ bound }] = (
          await store.driver.query<{ bound: number }>('SELECT @@GLOBAL.innodb_lock_wait_timeout AS bound', [])
        ).rows as [{ bound: number }];
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
  });
}
