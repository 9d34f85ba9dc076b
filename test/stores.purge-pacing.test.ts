import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { pacedDeletes, purgeInBatches } from '../src/stores/internal.js';
import { sqliteStore } from '../src/stores/sqlite/index.js';

describe('purgeInBatches (the SQLite and PostgreSQL purges)', () => {
  it('rests after every full batch, never after the short one that ends the purge', async () => {
    const batches = [3, 3, 3, 1];
    const steps: string[] = [];
    const deleted = await purgeInBatches(
      3,
      async () => {
        const count = batches.shift()!;
        steps.push(`delete ${count}`);
        return count;
      },
      async (ms) => {
        expect(ms).toBeGreaterThanOrEqual(1);
        steps.push('rest');
      },
    );
    expect(deleted).toBe(10);
    expect(steps).toEqual(['delete 3', 'rest', 'delete 3', 'rest', 'delete 3', 'rest', 'delete 1']);
  });

  it('rests about as long as the batch took, so a purge takes at most about half the time', async () => {
    const rests: number[] = [];
    let clockMs = 0;
    const batchMs = [40, 7];
    await purgeInBatches(
      1,
      async () => {
        clockMs += batchMs.shift() ?? 0;
        return rests.length < 2 ? 1 : 0;
      },
      async (ms) => {
        rests.push(ms);
      },
      () => clockMs,
    );
    expect(rests).toEqual([40, 7]);
  });

  it('deletes nothing more once a batch comes back empty', async () => {
    let calls = 0;
    const deleted = await purgeInBatches(
      5,
      async () => {
        calls++;
        return 0;
      },
      async () => {
        throw new Error('no rest expected');
      },
    );
    expect([deleted, calls]).toEqual([0, 1]);
  });
});

describe('pacedDeletes (the SQLite purge’s statements)', () => {
  it('sizes each statement by the last one’s time, pausing for the event loop between two', async () => {
    let clockMs = 0;
    let msPerRow = 0.1;
    let expired = 40;
    const steps: string[] = [];
    const deleteBatch = pacedDeletes(
      1,
      async (limit) => {
        const count = Math.min(limit, expired);
        expired -= count;
        clockMs += count * msPerRow;
        steps.push(`delete ${limit}`);
        return count;
      },
      async () => {
        steps.push('pause');
        if (steps.length === 8) msPerRow = 0.5; // the machine got busy: 8 rows now take 4 ms
      },
      () => clockMs,
    );
    // Doubling while under half the budget (1, 2, 4 rows), then holding at 8 (0.8 ms); once
    // a statement overruns the budget, halving until one fits again (4 rows: 2 ms; 2 rows: 1 ms);
    // the last statement asks only for the row the batch has left.
    expect(await deleteBatch(30)).toBe(30);
    expect(steps.filter((step) => step !== 'pause')).toEqual([
      'delete 1',
      'delete 2',
      'delete 4',
      'delete 8',
      'delete 8',
      'delete 4',
      'delete 2',
      'delete 1',
    ]);
    expect(steps.filter((step) => step === 'pause')).toHaveLength(7);
    // The next batch starts at the size the last statement left, and ends on a short statement.
    steps.length = 0;
    expect(await deleteBatch(30)).toBe(10);
    expect(steps.filter((step) => step !== 'pause').slice(0, 2)).toEqual(['delete 2', 'delete 2']);
    expect(steps.at(-1)).not.toBe('pause');
  });

  it('never asks one statement for more rows than the batch has left', async () => {
    const asked: number[] = [];
    const deleteBatch = pacedDeletes(
      1000,
      async (limit) => {
        asked.push(limit);
        return limit;
      },
      async () => undefined,
      () => 0,
    );
    expect(await deleteBatch(10)).toBe(10);
    expect(asked).toEqual([1, 2, 4, 3]);
    expect(Math.max(...asked)).toBeLessThanOrEqual(10);
  });
});

describe('sqliteStore.purgeExpired: requests run between the purge’s statements', () => {
  it('starts with a DELETE of a few rows, and the event loop turns between statements', async () => {
    const store = sqliteStore({ url: ':memory:', driver: 'better-sqlite3' });
    await store.migrate();
    const database = store.database as InstanceType<typeof Database>;
    const pastMs = Date.now() - 1000;
    database.exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 2000)
      INSERT INTO idempotency_keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms,
        expires_at_ms, completed_at_ms, status, headers, body)
      SELECT 's', lower(hex(randomblob(16))), 'fp', 't', ${pastMs}, ${pastMs},
        ${pastMs}, ${pastMs}, 201, '{}', randomblob(64) FROM g`);
    const count = database.prepare('SELECT count(*) FROM idempotency_keys').pluck();
    // What a request served between two statements would see: the rows deleted since the last one.
    const seen: number[] = [];
    let last = count.get() as number;
    let purging = true;
    const purge = store.purgeExpired(200);
    const watch = (async () => {
      while (purging) {
        const now = count.get() as number;
        if (now !== last) seen.push(last - now);
        last = now;
        await new Promise((resolve) => setImmediate(resolve));
      }
    })();
    expect(await purge).toBe(2000);
    purging = false;
    await watch;
    // A 200-row batch in one statement was seen as one step of 200 (the 1 ms budget never lets
    // the first statements, of 1 and then at most 2 rows, run long).
    expect(Math.max(...seen.slice(0, 2))).toBeLessThanOrEqual(3);
    expect(seen.length).toBeGreaterThan(10);
    await store.close();
  });
});

describe('sqliteStore.purgeExpired: the WAL is checkpointed off the serving connection', () => {
  it('turns the connection’s auto-checkpoint off while it purges, keeps the WAL bounded, and restores it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rs-purge-wal-'));
    const filename = join(dir, 'keys.db');
    const database = new Database(filename);
    database.pragma('journal_mode = WAL');
    const store = sqliteStore({ database });
    await store.migrate();
    try {
      // 20k records past retention, with random keys as clients send them: every batch dirties
      // pages all over the primary key, so the WAL grows by hundreds of pages a batch.
      const pastMs = Date.now() - 1000;
      database.exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 20000)
        INSERT INTO idempotency_keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms,
          expires_at_ms, completed_at_ms, status, headers, body)
        SELECT 's', lower(hex(randomblob(16))), lower(hex(randomblob(32))), 't', ${pastMs}, ${pastMs},
          ${pastMs}, ${pastMs}, 201, '{}', randomblob(64) FROM g`);
      database.pragma('wal_checkpoint(TRUNCATE)');
      const autoCheckpoints = new Set<number>();
      let largestWalBytes = 0;
      let purging = true;
      const purge = store.purgeExpired();
      const watch = (async () => {
        while (purging) {
          autoCheckpoints.add(database.pragma('wal_autocheckpoint', { simple: true }) as number);
          largestWalBytes = Math.max(largestWalBytes, statSync(`${filename}-wal`).size);
          await new Promise((resolve) => setImmediate(resolve));
        }
      })();
      const deleted = await purge;
      purging = false;
      await watch;
      expect(deleted).toBe(20_000);
      // The serving connection never checkpoints during the purge (a 1,000-page checkpoint with
      // its fsync held every request back), and a checkpointer elsewhere kept the WAL small.
      expect([...autoCheckpoints]).toEqual([0]);
      expect(largestWalBytes).toBeLessThan(16 * 1024 * 1024);
      expect(database.pragma('wal_autocheckpoint', { simple: true })).toBe(1000);
    } finally {
      await store.close();
      database.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
