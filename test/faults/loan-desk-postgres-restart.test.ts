import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { createRetryingFetch } from '../../src/client/index.js';
import { listLoans, postLoan, startLoanDesk } from '../support/loan-desk.js';
import {
  errorCode,
  expectDeskAlive,
  flowThroughFault,
  HANG_BOUND_MS,
  RECOVERY_BOUND_MS,
} from '../support/loan-flow.js';
import { databaseUp, pgctl } from '../support/postgres-cluster.js';
import { hasPostgres, PG_URL, uniqueName } from '../support/services.js';

/**
 * The loan desk on PostgreSQL while the cluster restarts under a steady flow of keyed loans:
 * JSON 503s during the outage, no hang, no crash, recovery by itself, one loan per intent.
 */

describe.skipIf(!hasPostgres)('loan desk on PostgreSQL while the cluster restarts', () => {
  const schemas: string[] = [];
  const databaseUrl = () => {
    const schema = uniqueName('rs_desk_pg_restart');
    schemas.push(schema);
    return { schema, url: `${PG_URL}?schema=${schema}` };
  };

  afterAll(async () => {
    // Whatever happened above, leave the shared cluster running.
    if (!(await databaseUp())) await pgctl('start');
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    for (const schema of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.end();
  });

  const variants = [
    { name: 'atomic mode, one process', workers: 1, env: {} },
    { name: 'atomic mode, WORKERS=2', workers: 2, env: {} },
    // A short lease: a key whose release failed in the outage is free again soon after.
    {
      name: 'lease mode, keys in PostgreSQL',
      workers: 1,
      env: { IDEMPOTENCY_MODE: 'lease', IDEMPOTENCY_LEASE: '3s' },
    },
  ];

  it.each(variants)(
    '$name: JSON 503s during the outage, recovery, one loan per intent',
    async ({ name, workers, env }) => {
      const desk = await startLoanDesk({ workers, env: { DATABASE_URL: databaseUrl().url, ...env } });
      try {
        await flowThroughFault(desk, `loan desk on PostgreSQL, ${name}`, () =>
          pgctl('restart').then(() => {}),
        );
      } finally {
        expect(await desk.stop()).toBe(0);
      }
    },
  );

  it("atomic mode: the loan's own INSERT failing in its transaction is a JSON 503; the retry lends once", async () => {
    const { schema, url } = databaseUrl();
    const desk = await startLoanDesk({ env: { DATABASE_URL: url } });
    const admin = new pg.Client({ connectionString: PG_URL });
    const locker = new pg.Client({ connectionString: PG_URL });
    for (const client of [admin, locker]) {
      client.on('error', () => {});
      await client.connect();
    }
    try {
      // The claim goes through; the loan's INSERT then waits on the table lock, inside the
      // transaction holding the claim, and its connection is cut there, as a restart cuts it.
      await locker.query('BEGIN');
      await locker.query(`LOCK TABLE "${schema}".loan IN EXCLUSIVE MODE`);
      const body = { member: 'U-1001', isbn: 'K-01', issuedAt: '2030-01-01' };
      const key = `blocked-${randomUUID()}`;
      const pending = postLoan(desk.baseUrl, body, { key });
      const terminateBlockedLoan = async () =>
        (
          await admin.query(
            `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE $1`,
            [`%INSERT INTO "${schema}".loan%`],
          )
        ).rowCount === 1;
      const deadline = Date.now() + 10_000;
      while (!(await terminateBlockedLoan())) {
        if (Date.now() > deadline) throw new Error('the loan never waited on the lock');
        await sleep(20);
      }
      const failed = await Promise.race([pending, sleep(HANG_BOUND_MS).then(() => 'hung' as const)]);
      if (failed === 'hung') throw new Error(`no answer within ${HANG_BOUND_MS} ms`);
      expect(`${failed.status} ${errorCode(failed.text)}`).toMatch(/^503 (store|database)_unavailable$/);
      // The desk answered the failed write itself (it is logged on stderr, which may trail the answer).
      for (let waitedMs = 0; waitedMs < 2000 && !/lending failed/.test(desk.output()); waitedMs += 20) {
        await sleep(20);
      }
      expect(desk.output()).toMatch(/loan desk: lending failed/);
      await locker.query('ROLLBACK');

      const retryingFetch = createRetryingFetch({ maxAttempts: 100, deadlineMs: RECOVERY_BOUND_MS });
      const retried = await retryingFetch(`${desk.baseUrl}/loans`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        idempotencyKey: key,
      });
      expect(retried.status).toBe(201);
      expect(retried.headers.get('idempotency-replayed')).toBeNull();
      const replayed = await postLoan(desk.baseUrl, body, { key });
      expect(replayed.headers.get('idempotency-replayed')).toBe('true');
      expect(await listLoans(desk.baseUrl)).toEqual([
        expect.objectContaining({ ...body, id: replayed.body.id }),
      ]);
      expectDeskAlive(desk);
    } finally {
      await Promise.all([admin.end().catch(() => {}), locker.end().catch(() => {})]);
      expect(await desk.stop()).toBe(0);
    }
  });
});
