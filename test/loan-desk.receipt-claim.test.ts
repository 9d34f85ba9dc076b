import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { openSqlite } from '../examples/library-loans/databases/sqlite.js';

// Every desk process claims its receipts' outbox after each burst of loans, holding SQLite's write
// lock while it looks, and reads it every 2 s for jobs nobody announced. Sent jobs stay in the
// table, so a claim that scanned them would slow with every loan ever made (the full bench's desk
// once fell from 1,100 to 130 req/s over five rounds).
describe('loan desk (SQLite): claiming receipt jobs', () => {
  const dir = mkdtempSync(join(tmpdir(), 'retrysafe-receipt-claim-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('reads only unsent jobs, through an index of them, not the sent ones', async () => {
    const filename = join(dir, 'desk.db');
    const desk = await openSqlite({ filename, setup: true });
    const db = new Database(filename, { readonly: true });
    try {
      const plan = db
        .prepare(
          `EXPLAIN QUERY PLAN SELECT loan_id FROM receipt_job
           WHERE done_at_ms IS NULL AND claimed_until_ms <= 0 ORDER BY loan_id LIMIT 10`,
        )
        .all() as { detail: string }[];
      const details = plan.map((row) => row.detail).join('; ');
      expect(details).toContain('USING INDEX receipt_job_pending');
      expect(await desk.claimReceiptJobs(10, 1_000)).toEqual([]);
      expect(await desk.receiptJobsWaiting()).toBe(false);
    } finally {
      db.close();
      await desk.close?.();
    }
  });
});
