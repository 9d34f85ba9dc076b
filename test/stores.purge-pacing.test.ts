import { describe, expect, it } from 'vitest';
import { purgeInBatches } from '../src/stores/internal.js';

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
