import { expect, it } from 'vitest';
import { openMysql } from '../examples/library-loans/databases/mysql.js';
import { openPostgres } from '../examples/library-loans/databases/postgres.js';
import { openSqlite } from '../examples/library-loans/databases/sqlite.js';
import { describeEachDatabase, tempDatabaseUrl } from './support/loan-desk.js';
import { dropSchemas, hasMysql, hasPostgres, mysqlDatabase, PG_URL, uniqueName } from './support/services.js';

const LOAN = { member: 'U-1001', isbn: 'K-01', issuedAt: '2026-11-29' };

interface Job {
  loanId: number;
}

interface DeskDatabase {
  createLoan(loan: typeof LOAN): Promise<{ loan?: { id: number } }>;
  /** Each engine's rows of `Job`s (mysql2 types them as any result). */
  claimReceiptJobs(limit: number, leaseMs: number): Promise<unknown>;
  recordReceipts(receipts: object[]): Promise<Set<number>>;
  getReceipt(id: number): Promise<{ receipt?: object } | undefined>;
  countLoans(): Promise<number>;
  close(): Promise<void>;
}

/** The loans whose receipt jobs a claim (of up to 10, for a minute) took. */
const claimed = async (database: DeskDatabase) =>
  ((await database.claimReceiptJobs(10, 60_000)) as Job[]).map((job) => job.loanId);

/** A desk database of each engine, and a way to run the seed's own SQL on it. */
interface Engine {
  name: string;
  skip: boolean;
  /** SQL giving the receipts' tables the foreign keys they had before they cascaded. */
  unCascade: string;
  open(): Promise<Opened>;
}

interface Opened {
  database: DeskDatabase;
  exec(sql: string): Promise<unknown>;
  /** The same database opened again, with a setup. */
  reopen(): Promise<Opened>;
  drop(): Promise<void>;
}

/** SQLite cannot alter a foreign key: each table is made again, rows copied. */
const sqliteTableWithoutCascade = (table: string, columns: string, index = '') => `
  ALTER TABLE ${table} RENAME TO ${table}_new;
  CREATE TABLE ${table} (${columns});
  INSERT INTO ${table} SELECT * FROM ${table}_new;
  DROP TABLE ${table}_new;${index}`;

const ENGINES: Engine[] = [
  {
    name: 'SQLite',
    skip: false,
    unCascade:
      sqliteTableWithoutCascade(
        'receipt_job',
        `loan_id INTEGER PRIMARY KEY REFERENCES loan (id), attempts INTEGER NOT NULL DEFAULT 0,
         claimed_until_ms INTEGER NOT NULL DEFAULT 0, done_at_ms INTEGER`,
        'CREATE INDEX receipt_job_pending ON receipt_job (loan_id) WHERE done_at_ms IS NULL;',
      ) +
      sqliteTableWithoutCascade(
        'receipt',
        `id INTEGER PRIMARY KEY AUTOINCREMENT, loan_id INTEGER NOT NULL REFERENCES loan (id),
         body TEXT NOT NULL, lease_key TEXT UNIQUE`,
      ),
    async open() {
      const filename = tempDatabaseUrl('delete-loan');
      const open = async (): Promise<Opened> => {
        const database = await openSqlite({ filename, setup: true });
        // The desk's own connection, which enforces the foreign keys.
        const exec = (sql: string) => database.store.transaction(() => database.store.database.exec(sql));
        return { database, exec, reopen: open, drop: async () => {} };
      };
      return open();
    },
  },
  {
    name: 'PostgreSQL',
    skip: !hasPostgres,
    unCascade: ['receipt_job', 'receipt']
      .map(
        (table) => `ALTER TABLE ${table} DROP CONSTRAINT ${table}_loan_id_fkey,
          ADD CONSTRAINT ${table}_loan_id_fkey FOREIGN KEY (loan_id) REFERENCES loan (id);`,
      )
      .join('\n'),
    async open() {
      const schema = uniqueName('delete_loan');
      const open = async (): Promise<Opened> => {
        const database = await openPostgres({ url: PG_URL, schema, setup: true });
        const exec = (sql: string) => database.store.pool.query(`SET search_path TO "${schema}"; ${sql}`);
        return { database, exec, reopen: open, drop: () => dropSchemas(schema) };
      };
      return open();
    },
  },
  {
    name: 'MariaDB',
    skip: !hasMysql,
    // The desk's tables name no constraint: MariaDB names them <table>_ibfk_<n>.
    unCascade: ['receipt_job', 'receipt']
      .map(
        (table) =>
          `ALTER TABLE ${table} DROP FOREIGN KEY ${table}_ibfk_1, ADD FOREIGN KEY (loan_id) REFERENCES loan (id);`,
      )
      .join('\n'),
    async open() {
      const made = await mysqlDatabase();
      const open = async (): Promise<Opened> => {
        const database = await openMysql({ url: made.url, setup: true });
        const exec = async (sql: string) => {
          for (const statement of sql.split(';').filter((text) => text.trim())) {
            await database.store.pool.query(statement);
          }
        };
        return { database, exec, reopen: open, drop: made.drop };
      };
      return open();
    },
  },
];

// The seed clears its table between runs with `DELETE FROM loan`: each loan's receipt job and
// receipt go with it, and a loan deleted before its receipt went out gets none.
describeEachDatabase('loan desk ($name): deleting loans', ENGINES, (engine) => {
  it('DELETE FROM loan works with receipt jobs waiting, and a deleted loan’s job is not claimed', async () => {
    const { database, exec, drop } = await engine.open();
    try {
      const gone = (await database.createLoan(LOAN)).loan!.id;
      await exec('DELETE FROM loan');
      expect(await database.countLoans()).toBe(0);
      const kept = (await database.createLoan(LOAN)).loan!.id;
      expect(await claimed(database)).toEqual([kept]);
      expect(kept).not.toBe(gone);
    } finally {
      await database.close();
      await drop();
    }
  });

  it('a loan deleted after its job was claimed gets no receipt; sent receipts go with their loans', async () => {
    const { database, exec, drop } = await engine.open();
    try {
      const ids = [];
      for (let i = 0; i < 3; i++) ids.push((await database.createLoan(LOAN)).loan!.id);
      const [sent, deleted, other] = ids as [number, number, number];
      expect(await claimed(database)).toEqual(ids);
      const receiptOf = (loanId: number) => ({ loanId, ...LOAN, sentAt: '2026-12-03T00:00:00.000Z' });
      expect(await database.recordReceipts([receiptOf(sent)])).toEqual(new Set([sent]));
      // A second delivery of a sent job (its claim outlived its lease) writes nothing.
      expect(await database.recordReceipts([receiptOf(sent)])).toEqual(new Set());
      await exec(`DELETE FROM loan WHERE id = ${deleted}`);
      // The batch still holds the deleted loan's job: only the other loan's receipt is written.
      expect(await database.recordReceipts([receiptOf(deleted), receiptOf(other)])).toEqual(new Set([other]));
      expect(await database.getReceipt(deleted)).toBeUndefined();
      expect((await database.getReceipt(other))?.receipt).toMatchObject({ loanId: other });
      await exec('DELETE FROM loan');
      expect([await database.countLoans(), await database.getReceipt(sent)]).toEqual([0, undefined]);
    } finally {
      await database.close();
      await drop();
    }
  });

  it('a database made before the cascade gains it at the next setup', async () => {
    const made = await engine.open();
    let opened = made;
    try {
      await made.exec(engine.unCascade);
      const id = (await made.database.createLoan(LOAN)).loan!.id;
      await claimed(made.database);
      await made.database.recordReceipts([{ loanId: id, ...LOAN }]);
      await expect(made.exec('DELETE FROM loan')).rejects.toThrow(/foreign key/i);
      await made.database.close();
      opened = await made.reopen();
      await opened.exec('DELETE FROM loan');
      expect([await opened.database.countLoans(), await opened.database.getReceipt(id)]).toEqual([
        0,
        undefined,
      ]);
    } finally {
      await opened.database.close();
      await opened.drop();
    }
  });
});
