import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { Sequelize, type Transaction } from 'sequelize';
import sqlite3 from 'sqlite3';
import { describe, expect, it } from 'vitest';
import { sequelizeStore } from '../src/stores/sql/drivers/sequelize.js';
import { describeSqliteOrmStore, type SqliteAdmin } from './conformance/orm-sqlite-suite.js';
import { claimInput, textResponse } from './support/store-calls.js';

/** The instance a transaction belongs to (Sequelize keeps it on the transaction without typing it). */
const instanceOf = (tx: Transaction) => (tx as unknown as { sequelize: Sequelize }).sequelize;

/** The suite's own connection on node-sqlite3, the library Sequelize runs SQLite on. */
async function sqlite3Admin(url: string): Promise<SqliteAdmin> {
  const db = await new Promise<sqlite3.Database>((resolve, reject) => {
    const opened: sqlite3.Database = new sqlite3.Database(url, (error) =>
      error ? reject(error) : resolve(opened),
    );
  });
  const get = promisify(db.get.bind(db)) as (sql: string) => Promise<{ n: number }>;
  return {
    exec: promisify(db.exec.bind(db)),
    count: async (table) => (await get(`SELECT count(*) AS n FROM ${table}`)).n,
    close: promisify(db.close.bind(db)),
  };
}

describe('sequelize on SQLite (sqlite3)', () => {
  describeSqliteOrmStore<Transaction>(
    'sequelize',
    async (url) => {
      const sequelize = new Sequelize({ dialect: 'sqlite', storage: url, logging: false });
      return {
        store: (options) => sequelizeStore(sequelize, options),
        insert: (tx, table) => sequelize.query(`INSERT INTO ${table} DEFAULT VALUES`, { transaction: tx }),
        // Sequelize nests a transaction given a parent transaction as a savepoint.
        nested: (tx, work) => sequelize.transaction({ transaction: tx }, (inner) => work(inner)),
        end: { commit: (tx) => tx.commit(), rollback: (tx) => tx.rollback() },
        rawCommit: (tx) => sequelize.query('COMMIT', { transaction: tx }),
        close: () => sequelize.close(),
      };
    },
    (tx, sql) => instanceOf(tx).query(sql, { transaction: tx }),
    sqlite3Admin,
  );

  it("an operation waits its turn behind one that holds SQLite's write lock past node-sqlite3's busy timeout and Sequelize's retries", async () => {
    // Sequelize opens a connection per transaction; node-sqlite3 gives each a busy timeout of
    // 1000 ms, and Sequelize retries a busy BEGIN 5 times (about 5.5 s in all), past which a second
    // writer fails SQLITE_BUSY unless it waits in turn: the first holds the lock 7 s.
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-sequelize-turns-'));
    const sequelize = new Sequelize({ dialect: 'sqlite', storage: join(dir, 'test.db'), logging: false });
    try {
      const store = sequelizeStore(sequelize, { migrate: true });
      await store.migrate();
      let held!: () => void;
      const holding = new Promise<void>((resolve) => (held = resolve));
      const first = store.atomic(claimInput('holds'), async () => {
        held();
        await sleep(7000);
        return { response: textResponse('a'), commit: true };
      });
      await holding;
      // Called from outside the first operation's work, as another request would be.
      const second = store.atomic(claimInput('waits'), async () => ({
        response: textResponse('b'),
        commit: true,
      }));
      expect(await first).toMatchObject({ outcome: 'executed', committed: true });
      expect(await second).toMatchObject({ outcome: 'executed', committed: true });
    } finally {
      await sequelize.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 20_000);
});
