import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { sqlStore } from '../src/stores/sql/store.js';
import { sqliteDriver } from '../src/stores/sqlite/sql-driver.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';
import { claimInput, textResponse } from './support/store-calls.js';

describe('the SQL store on better-sqlite3', () => {
  describeSqliteOrmStore<Database.Database>(
    'better-sqlite3',
    async (url) => {
      const driver = sqliteDriver(new Database(url));
      return {
        store: (options) => sqlStore(driver, options),
        insert: async (tx, table) => tx.prepare(`INSERT INTO ${table} DEFAULT VALUES`).run(),
        // A transaction opened inside another one of the driver's is its savepoint.
        nested: (_tx, work) => driver.transaction(work),
        rawCommit: async (tx) => tx.exec('COMMIT'),
        close: () => driver.close(),
      };
    },
    async (tx, sql) => tx.exec(sql),
  );

  describe('BEGIN IMMEDIATE across connections', () => {
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-sqlite-driver-'));
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it('a duplicate on another connection is refused the write lock, waits for it without blocking, then replays', async () => {
      const file = join(dir, 'two.db');
      const first = new Database(file);
      first.pragma('journal_mode = WAL');
      first.exec('CREATE TABLE orders (id INTEGER PRIMARY KEY)');
      const second = new Database(file);
      // Says when the second connection's BEGIN IMMEDIATE met the first's lock.
      let blocked!: () => void;
      const refused = new Promise<void>((resolve) => (blocked = resolve));
      const exec = second.exec.bind(second);
      second.exec = (sql: string) => {
        try {
          return exec(sql);
        } catch (error) {
          if ((error as { code?: string }).code === 'SQLITE_BUSY') blocked();
          throw error;
        }
      };
      const stores = [sqliteDriver(first), sqliteDriver(second)].map((driver) =>
        sqlStore(driver, { migrate: true }),
      );
      await stores[0]!.migrate();
      const input = claimInput('hot');
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      let runs = 0;
      const work = (wait: boolean) => async (tx: Database.Database) => {
        runs++;
        tx.prepare('INSERT INTO orders DEFAULT VALUES').run();
        if (wait) await held;
        return { response: textResponse('ok'), commit: true };
      };
      const original = stores[0]!.atomic(input, work(true));
      // The original holds the lock once its work runs; only then may the duplicate start.
      while (runs === 0) await new Promise((resolve) => setImmediate(resolve));
      const duplicate = stores[1]!.atomic(input, work(false));
      await refused;
      release();
      expect(await original).toMatchObject({ outcome: 'executed', committed: true });
      expect(await duplicate).toMatchObject({ outcome: 'replay', response: { status: 201 } });
      expect(runs).toBe(1);
      expect((first.prepare('SELECT count(*) AS n FROM orders').get() as { n: number }).n).toBe(1);
      first.close();
      second.close();
    });
  });

  // Issue 33 item 2: transactions queued behind an open one commit with it, each answered only
  // once that commit has run (another connection sees its writes by then).
  describe('group commit', () => {
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-sqlite-group-'));
    afterAll(() => rmSync(dir, { recursive: true, force: true }));
    let files = 0;

    function open(schema = 'CREATE TABLE t (id INTEGER PRIMARY KEY)', journal = 'WAL') {
      const file = join(dir, `group-${++files}.db`);
      const db = new Database(file);
      db.pragma(`journal_mode = ${journal}`);
      db.pragma('foreign_keys = ON');
      db.exec(schema);
      // Counts the COMMITs the driver runs (it prepares its COMMIT once).
      const counted = { commits: 0 };
      const prepare = db.prepare.bind(db);
      db.prepare = ((sql: string) => {
        const statement = prepare(sql);
        if (sql !== 'COMMIT') return statement;
        const run = statement.run.bind(statement);
        return Object.assign(statement, {
          run: () => {
            counted.commits++;
            return run();
          },
        });
      }) as typeof db.prepare;
      const driver = sqliteDriver(db);
      const other = new Database(file, { readonly: true });
      const committed = (id: number) => other.prepare('SELECT 1 FROM t WHERE id = ?').get(id) !== undefined;
      return { db, driver, other, committed, counted };
    }

    const insert = (id: number) => async (tx: Database.Database) => {
      await Promise.resolve();
      tx.prepare('INSERT INTO t (id) VALUES (?)').run(id);
      return id;
    };

    it('ten transactions started together commit in fewer COMMITs, each answered after its own commit', async () => {
      const { driver, committed, counted, other } = open();
      const ids = Array.from({ length: 10 }, (_, i) => i + 1);
      // Whether another connection saw each write when its transaction answered.
      const seen = await Promise.all(ids.map((id) => driver.transaction(insert(id)).then(committed)));
      expect(seen).toEqual(ids.map(() => true));
      expect(counted.commits).toBeLessThan(10);
      other.close();
      await driver.close();
    });

    it('a member that fails rolls back only its own writes; the others commit', async () => {
      const { driver, committed, counted, other } = open();
      const failing = driver.transaction(async (tx) => {
        await insert(2)(tx);
        throw new Error('refused');
      });
      const results = await Promise.allSettled([
        driver.transaction(insert(1)),
        failing,
        driver.transaction(insert(3)),
      ]);
      expect(results.map((result) => result.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
      expect((results[1] as PromiseRejectedResult).reason).toMatchObject({ message: 'refused' });
      expect([1, 2, 3].map(committed)).toEqual([true, false, true]);
      expect(counted.commits).toBe(1);
      other.close();
      await driver.close();
    });

    it('a read while a transaction is open answers at once, from what has committed (WAL: a reader connection)', async () => {
      const { driver, other } = open();
      await driver.transaction(insert(1));
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      const writing = driver.transaction(async (tx) => {
        tx.prepare('INSERT INTO t (id) VALUES (2)').run();
        await held;
      });
      const read = await driver.query<{ id: number }>('SELECT id FROM t ORDER BY id', []);
      expect(read.rows).toEqual([{ id: 1 }]);
      release();
      await writing;
      expect((await driver.query('SELECT id FROM t ORDER BY id', [])).rows).toEqual([{ id: 1 }, { id: 2 }]);
      other.close();
      await driver.close();
    });

    it('without WAL, a read queued behind the group sees its writes and is answered after the commit', async () => {
      const { driver, committed, other } = open(undefined, 'DELETE');
      const writes = [driver.transaction(insert(7)), driver.transaction(insert(8))];
      const read = driver.query<{ id: number }>('SELECT id FROM t WHERE id = ?', [7]).then((result) => ({
        rows: result.rows,
        committed: committed(7),
      }));
      await Promise.all(writes);
      expect(await read).toEqual({ rows: [{ id: 7 }], committed: true });
      other.close();
      await driver.close();
    });

    it('exclusive() queued behind the group runs once it has committed, outside any transaction', async () => {
      const { driver, committed, other } = open();
      const writes = [driver.transaction(insert(1)), driver.transaction(insert(2))];
      const outside = await driver.exclusive((connection) => ({
        inTransaction: connection.inTransaction(),
        committed: [committed(1), committed(2)],
      }));
      expect(outside).toEqual({ inTransaction: false, committed: [true, true] });
      await Promise.all(writes);
      other.close();
      await driver.close();
    });

    it('a member whose work ends the transaction fails the members before it, whose writes it took along', async () => {
      const { driver, committed, other } = open();
      const results = await Promise.allSettled([
        driver.transaction(insert(1)),
        driver.transaction(async (tx) => {
          await insert(2)(tx);
          tx.exec('ROLLBACK');
          return 2;
        }),
        driver.transaction(insert(3)),
      ]);
      expect(results.map((result) => result.status)).toEqual(['rejected', 'rejected', 'fulfilled']);
      expect((results[0] as PromiseRejectedResult).reason.message).toMatch(/retry it/);
      expect([1, 2, 3].map(committed)).toEqual([false, false, true]);
      other.close();
      await driver.close();
    });

    it("a deferred constraint that fails the group's COMMIT fails every member: none is answered as committed", async () => {
      const { driver, committed, other } = open(`CREATE TABLE t (id INTEGER PRIMARY KEY);
        CREATE TABLE child (parent INTEGER REFERENCES t (id) DEFERRABLE INITIALLY DEFERRED)`);
      const results = await Promise.allSettled([
        driver.transaction(insert(1)),
        driver.transaction(async (tx) => {
          await Promise.resolve();
          tx.prepare('INSERT INTO child (parent) VALUES (99)').run();
        }),
      ]);
      expect(results.map((result) => result.status)).toEqual(['rejected', 'rejected']);
      for (const result of results)
        expect((result as PromiseRejectedResult).reason).toMatchObject({
          code: 'SQLITE_CONSTRAINT_FOREIGNKEY',
        });
      expect(committed(1)).toBe(false);
      // The connection is usable after: the next transaction commits on its own.
      await driver.transaction(insert(5));
      expect(committed(5)).toBe(true);
      other.close();
      await driver.close();
    });
  });
});
