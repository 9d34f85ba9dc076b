import { describe, expect, it } from 'vitest';
import { startLoanDesk } from './support/loan-desk.js';
import { flowThroughFault } from './support/loan-flow.js';
import { holdSqliteWriteLock } from './support/sqlite-locker.js';

/**
 * The loan desk on SQLite while another process holds the database's write lock past the desk's
 * busy timeout (5 s), under a steady flow of keyed loans: JSON 503s with Retry-After while it is
 * held, no hang, no crash, recovery by itself, one loan per intent.
 */

/** Past the desk's 5 s busy timeout, so that requests give up while it is held. */
const LOCK_HOLD_MS = 7000;

describe('loan desk on SQLite while another process holds the write lock', () => {
  const variants = [
    { name: 'atomic mode', env: {} },
    { name: 'lease mode, keys in SQLite', env: { IDEMPOTENCY_MODE: 'lease', IDEMPOTENCY_LEASE: '3s' } },
  ];

  it.each(variants)(
    '$name: JSON 503s while locked, recovery, one loan per intent',
    async ({ name, env }) => {
      const desk = await startLoanDesk({ env });
      try {
        await flowThroughFault(desk, `loan desk on SQLite, ${name}, write lock held`, async () => {
          const { released } = await holdSqliteWriteLock(desk.databaseUrl, LOCK_HOLD_MS);
          await released;
        });
      } finally {
        expect(await desk.stop()).toBe(0);
      }
    },
    90_000,
  );
});
