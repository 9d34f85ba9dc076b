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
 * The suite's own connection to the file, beside the ORM's. It must be of the ORM's SQLite library:
 * two copies of SQLite in one process do not see each other's locks, so the last connection of
 * one to close deletes the WAL the other still writes to (node-sqlite3's, under Sequelize, took
 * a table the better-sqlite3 admin had just made with it).
 */
export interface SqliteAdmin {
  exec(sql: string): Promise<void>;
  count(table: string): Promise<number>;
  close(): Promise<void>;
}

/** The admin connection on better-sqlite3, the library of every SQLite ORM here but Sequelize's. */
const betterSqliteAdmin = async (url: string): Promise<SqliteAdmin> => {
  const db = new Database(url);
  return {
    exec: async (sql) => void db.exec(sql),
    count: async (table) => (db.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n,
    close: async () => void db.close(),
  };
};

/**
 * SQLite under test: each place is a file of its own in WAL mode (the ORM's connection writes
 * while the admin connection counts), its URL the file's path.
 */
const sqliteDatabase = (openAdmin: (url: string) => Promise<SqliteAdmin>): DatabaseUnderTest => ({
  suffix: ' on SQLite',
  migrateUpFront: false,
  async fresh() {
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-orm-sqlite-'));
    const url = join(dir, 'test.db');
    const admin = await openAdmin(url);
    await admin.exec('PRAGMA journal_mode = WAL');
    return {
      url,
      options: {},
      missing: { table: 'none_here' },
      table: (name) => name,
      createTable: (name) => admin.exec(`CREATE TABLE ${name} (id INTEGER PRIMARY KEY)`),
      count: (name) => admin.count(name),
      async drop() {
        await admin.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  },
});

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
  /** The suite's own connection, on the ORM's SQLite library (better-sqlite3 unless given). */
  openAdmin: (url: string) => Promise<SqliteAdmin> = betterSqliteAdmin,
): void {
  describeOrmConformance(name, sqliteDatabase(openAdmin), open, (context) => {
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
