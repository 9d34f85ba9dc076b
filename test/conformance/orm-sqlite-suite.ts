import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { expect, it } from 'vitest';
import { isTransactionEnded } from '../../src/core/contract/index.js';
import { claimInput } from '../support/store-calls.js';
import { type DatabaseUnderTest, describeOrmConformance, type OrmUnderTest } from './orm-suite.js';

/** An ORM (or a plain SQLite binding) on a SQLite file, as its retrysafe binding uses it. */
export type SqliteOrmUnderTest<Tx> = OrmUnderTest<Tx>;

/**
 * SQLite under test: each place is a file of its own in WAL mode (the ORM's connection writes
 * while the admin connection counts), its URL the file's path.
 */
const sqlite: DatabaseUnderTest = {
  suffix: ' on SQLite',
  migrateUpFront: false,
  async fresh() {
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-orm-sqlite-'));
    const url = join(dir, 'test.db');
    const admin = new Database(url);
    admin.pragma('journal_mode = WAL');
    return {
      url,
      options: {},
      missing: { table: 'none_here' },
      table: (name) => name,
      async createTable(name) {
        admin.exec(`CREATE TABLE ${name} (id INTEGER PRIMARY KEY)`);
      },
      async count(name) {
        return (admin.prepare(`SELECT count(*) AS n FROM ${name}`).get() as { n: number }).n;
      },
      async drop() {
        admin.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  },
};

/**
 * An ORM binding's check on SQLite: the ORM conformance suite (`describeOrmConformance`) and
 * SQLite's own: the dialect, its error codes, the table made on first use, and a handler that
 * ends the transaction and opens another (a raw `COMMIT; BEGIN`), which the connection's own
 * "in a transaction" flag would miss. `open` makes a fresh ORM instance on the file at `url`
 * each time it is called.
 */
export function describeSqliteOrmStore<Tx>(
  name: string,
  open: (url: string) => Promise<SqliteOrmUnderTest<Tx>>,
  /** Runs raw SQL on `tx` through the ORM (a careless handler's `COMMIT; BEGIN`). */
  raw: (tx: Tx, sql: string) => Promise<unknown>,
): void {
  describeOrmConformance(name, sqlite, open, (context) => {
    const { rows, answer } = context;

    it('speaks the SQLite dialect; `schema` is refused', () => {
      const { orm, store } = context;
      expect(store.driver.dialect).toBe('sqlite');
      expect(() => orm.store({ schema: 'x' })).toThrow(/`schema` is PostgreSQL's/);
    });

    it("surfaces SQLite's error codes through the driver", async () => {
      const { driver } = context.store;
      const missing = await driver.query('SELECT 1 FROM no_such_table', []).catch((error: unknown) => error);
      expect(driver.errorCode(missing)).toBe('SQLITE_ERROR');
      await driver.query('CREATE TABLE codes (k TEXT PRIMARY KEY)', []);
      await driver.query('INSERT INTO codes (k) VALUES (?)', ['a']);
      const duplicate = await driver
        .query('INSERT INTO codes (k) VALUES (?)', ['a'])
        .catch((error: unknown) => error);
      expect(driver.errorCode(duplicate)).toMatch(/^SQLITE_CONSTRAINT/);
      expect(driver.errorCode(new Error('no code'))).toBeUndefined();
    });

    it('the handler commits and opens a transaction of its own: caught, and the write never runs again', async () => {
      const { orm, store, orders } = context;
      const before = await rows();
      const input = claimInput('commit-begin');
      let runs = 0;
      const work = async (tx: Tx) => {
        runs++;
        await orm.insert(tx, orders);
        await raw(tx, 'COMMIT');
        await raw(tx, 'BEGIN');
        return answer();
      };
      const failure = await store.atomic(input, work).catch((error: unknown) => error);
      expect(isTransactionEnded(failure)).toBe(true);
      expect(await rows()).toBe(before + 1);
      expect(await store.atomic(input, work)).toMatchObject({ outcome: 'replay', response: { status: 500 } });
      expect(runs).toBe(1);
    });
  });
}
