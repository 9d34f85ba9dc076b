import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { parseLoan } from '../examples/library-loans/app.js';
import { openSqlite } from '../examples/library-loans/databases/sqlite.js';

const LOAN = { member: 'U-1001', isbn: 'K-01', issuedAt: '2026-11-29' };

describe('loan desk: POST /loans body', () => {
  const issuedAt = (date: string) => {
    const { loan, problem } = parseLoan(Buffer.from(JSON.stringify({ ...LOAN, issuedAt: date })));
    return loan ? 'lent' : (problem as { field?: string }).field;
  };

  it('takes calendar dates, leap days of leap years included', () => {
    for (const date of ['2026-11-29', '2024-02-29', '2000-02-29', '0000-01-01', '9999-12-31']) {
      expect(issuedAt(date), date).toBe('lent');
    }
  });

  it('refuses dates the calendar lacks and other shapes', () => {
    for (const date of ['2026-02-31', '2023-02-29', '2100-02-29', '2026-13-01', '2026-00-10', '2026-04-31']) {
      expect(issuedAt(date), date).toBe('issuedAt');
    }
    for (const date of ['2026-04-00', '2026-4-01', '2026-04-01T00:00', ' 2026-04-01', '20260401']) {
      expect(issuedAt(date), date).toBe('issuedAt');
    }
  });
});

describe('loan desk (SQLite): lending', () => {
  const dir = mkdtempSync(join(tmpdir(), 'retrysafe-lend-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** The SQL of every statement run on the desk's connections while `fn` runs. */
  async function statementsOf(fn: () => Promise<unknown>): Promise<string[]> {
    const probe = new Database(':memory:');
    const prototype = Object.getPrototypeOf(probe.prepare('SELECT 1'));
    probe.close();
    const run: string[] = [];
    const originals = { get: prototype.get, run: prototype.run, all: prototype.all };
    for (const [name, original] of Object.entries(originals)) {
      prototype[name] = function (this: { source: string }, ...args: unknown[]) {
        run.push(this.source.trim().split(/\s+/).slice(0, 3).join(' '));
        return original.apply(this, args);
      };
    }
    try {
      await fn();
    } finally {
      Object.assign(prototype, originals);
    }
    return run;
  }

  it('a loan is its INSERT and its receipt job: the foreign keys check the catalog', async () => {
    const desk = await openSqlite({ filename: join(dir, 'desk.db'), setup: true, driver: 'better-sqlite3' });
    try {
      const statements = await statementsOf(() => desk.createLoan(LOAN));
      // A keyless loan, in a transaction of its own (BEGIN is an exec, not a statement).
      expect(statements).toEqual(['INSERT INTO loan', 'INSERT INTO receipt_job', 'COMMIT']);
      expect(await desk.countLoans()).toBe(1);
    } finally {
      await desk.close();
    }
  });

  it('a loan of an unknown book or member names the missing reference and lends nothing', async () => {
    const desk = await openSqlite({ filename: join(dir, 'refs.db'), setup: true, driver: 'better-sqlite3' });
    try {
      expect(await desk.createLoan({ ...LOAN, isbn: 'K-404' })).toEqual({ missing: 'isbn' });
      expect(await desk.createLoan({ ...LOAN, member: 'U-404' })).toEqual({ missing: 'member' });
      expect(await desk.createLoan({ ...LOAN, isbn: 'K-404', member: 'U-404' })).toEqual({ missing: 'isbn' });
      expect(await desk.countLoans()).toBe(0);
      expect((await desk.createLoan(LOAN)).loan).toMatchObject({ id: 1, ...LOAN });
    } finally {
      await desk.close();
    }
  });
});
