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
});
