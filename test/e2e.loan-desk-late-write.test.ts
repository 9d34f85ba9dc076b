import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { openPostgres } from '../examples/library-loans/databases/postgres.js';
import { openSqlite } from '../examples/library-loans/databases/sqlite.js';
import { createRetryingFetch } from '../src/client/index.js';
import { startLoanDesk, tempDatabaseUrl } from './support/loan-desk.js';
import { dropSchemas, hasPostgres, hasRedis, PG_URL, uniqueName } from './support/services.js';

/**
 * A dead owner's late write, in lease mode. Another session holds the loan table locked for 7 s;
 * ten intents arrive 100 ms apart and their INSERTs queue behind the lock; the desk is killed
 * with SIGKILL at 2 s and restarted half a second later. The dead desk's backends stay queued on
 * the lock, and once the lease has passed the retries run the handler again: before the loan was
 * keyed by its intent, both INSERTs committed when the lock was released (20 loans, 7 of 7 runs).
 */
const LOCK_MS = 7000;
const KILL_AT_MS = 2000;
const INTENTS = 10;

describe.skipIf(!hasPostgres)('loan desk in lease mode: a dead owner’s queued write', () => {
  const schemas: string[] = [];
  afterAll(() => dropSchemas(...schemas));

  const variants = [
    { name: 'keys in PostgreSQL', redis: false },
    { name: 'keys in Redis', redis: true },
  ].filter((variant) => !variant.redis || hasRedis);

  it.each(variants)(
    '$name: every intent ends 201 with one loan, though the dead desk’s INSERTs commit late',
    async ({ redis }) => {
      const schema = uniqueName('rs_desk_late');
      schemas.push(schema);
      const url = new URL(PG_URL);
      url.searchParams.set('schema', schema);
      const env = {
        DATABASE_URL: url.toString(),
        IDEMPOTENCY_MODE: 'lease',
        IDEMPOTENCY_LEASE: '3s',
        IDEMPOTENCY_WAIT: '2s',
        ...(redis ? { IDEMPOTENCY_STORE: `redis://127.0.0.1:6379?prefix=${uniqueName('rs_late')}:` } : {}),
      };
      let desk = await startLoanDesk({ env });
      const port = String(desk.port);
      const locker = new pg.Client({ connectionString: PG_URL });
      await locker.connect();
      try {
        await locker.query('BEGIN');
        await locker.query(`LOCK TABLE "${schema}".loan IN ACCESS EXCLUSIVE MODE`);
        const unlocked = sleep(LOCK_MS).then(() => locker.query('COMMIT'));

        // The restarted desk listens only once the lock lets its migration through (up to 5 s
        // refused connections, longer on a loaded machine): the deadline is the budget, not a count.
        const retrying = createRetryingFetch({ deadlineMs: 45_000, maxDelayMs: 1000, maxAttempts: 1000 });
        const answers = Array.from({ length: INTENTS }, async (_, i) => {
          await sleep(i * 100);
          const response = await retrying(`${desk.baseUrl}/loans`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ member: 'U-1001', isbn: 'K-02', issuedAt: '2026-03-10' }),
          });
          return { status: response.status, body: await response.json() };
        });

        await sleep(KILL_AT_MS);
        await desk.kill9();
        await sleep(500);
        desk = await startLoanDesk({ env: { ...env, PORT: port } });

        const answered = await Promise.all(answers);
        await unlocked;
        // The dead desk's backends commit as soon as the lock is gone; give them the time to.
        await sleep(1000);
        const { rows } = await locker.query<{ id: number }>(`SELECT id FROM "${schema}".loan ORDER BY id`);
        expect(answered.map((a) => a.status)).toEqual(Array(INTENTS).fill(201));
        expect(new Set(answered.map((a) => a.body.id)).size).toBe(INTENTS);
        expect(rows).toHaveLength(INTENTS);
        expect(rows.map((row) => row.id).sort()).toEqual(answered.map((a) => a.body.id).sort());
      } finally {
        await locker.end();
        await desk.stop();
      }
    },
    60_000,
  );
});

describe('the loan desk’s loan write is keyed by its intent', () => {
  const LOAN = { member: 'U-1001', isbn: 'K-02', issuedAt: '2026-03-10' };
  interface LoanDatabase {
    createLoan(
      loan: typeof LOAN,
      options?: { intent?: string; intentTtlMs?: number },
    ): Promise<{ loan: { id: number } }>;
    countLoans(): Promise<number>;
  }

  async function lendTwice(database: LoanDatabase) {
    const first = await database.createLoan(LOAN, { intent: 'intent-a' });
    const again = await database.createLoan(LOAN, { intent: 'intent-a' });
    const other = await database.createLoan(LOAN, { intent: 'intent-b' });
    const keyless = [await database.createLoan(LOAN), await database.createLoan(LOAN)];
    expect(again.loan).toEqual(first.loan);
    expect(other.loan.id).not.toBe(first.loan.id);
    expect(new Set(keyless.map((made) => made.loan.id)).size).toBe(2);
    expect(await database.countLoans()).toBe(4);
    // Past the key's retention the key names a new operation: a new loan, once.
    const lapsed = await database.createLoan(LOAN, { intent: 'intent-c', intentTtlMs: 1 });
    await sleep(20);
    const renewed = await database.createLoan(LOAN, { intent: 'intent-c', intentTtlMs: 60_000 });
    const again2 = await database.createLoan(LOAN, { intent: 'intent-c', intentTtlMs: 60_000 });
    expect(renewed.loan.id).not.toBe(lapsed.loan.id);
    expect(again2.loan).toEqual(renewed.loan);
    expect(await database.countLoans()).toBe(6);
  }

  it('on SQLite, a database made before the intent column gains it', async () => {
    const filename = tempDatabaseUrl('keyed');
    const old = new Database(filename);
    old.exec(`CREATE TABLE loan (id INTEGER PRIMARY KEY AUTOINCREMENT, member TEXT NOT NULL,
      isbn TEXT NOT NULL, issuedAt TEXT NOT NULL, "return" TEXT)`);
    old.close();
    const database = await openSqlite({ filename, setup: true, now: undefined });
    try {
      await lendTwice(database as unknown as LoanDatabase);
    } finally {
      await database.close();
    }
  });

  it.skipIf(!hasPostgres)('on PostgreSQL, a table made before the intent column gains it', async () => {
    const schema = uniqueName('rs_desk_keyed');
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    await admin.query(`CREATE SCHEMA "${schema}"; CREATE TABLE "${schema}".loan (
      id integer GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, member text NOT NULL,
      isbn text NOT NULL, "issuedAt" text NOT NULL, "return" text)`);
    await admin.end();
    const database = await openPostgres({ url: PG_URL, schema, setup: true });
    try {
      await lendTwice(database as unknown as LoanDatabase);
    } finally {
      await database.close();
      await dropSchemas(schema);
    }
  });
});
