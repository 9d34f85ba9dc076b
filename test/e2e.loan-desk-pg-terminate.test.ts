import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { startLoanDesk } from './support/loan-desk.js';
import { flowThroughFault } from './support/loan-flow.js';
import { dropSchemas, hasPostgres, PG_URL, uniqueName } from './support/services.js';

/**
 * The loan desk on PostgreSQL (WORKERS=2) while its connections are terminated every 40–100 ms
 * under a steady flow of keyed loans. Only this desk's backends are terminated: it
 * connects with an application_name of its own and the loop filters on it, so the PostgreSQL that
 * other suites share is left alone.
 */

/** How long backends keep being terminated. */
const TERMINATING_MS = 10_000;

describe.skipIf(!hasPostgres)('loan desk on PostgreSQL while its backends are terminated', () => {
  const schemas: string[] = [];
  afterAll(() => dropSchemas(...schemas));

  const variants = [
    { name: 'atomic mode', env: {} },
    // A short lease: a key whose release failed with its connection is free again soon after.
    { name: 'lease mode, keys in PostgreSQL', env: { IDEMPOTENCY_MODE: 'lease', IDEMPOTENCY_LEASE: '3s' } },
  ];

  it.each(variants)(
    'WORKERS=2, $name: no worker exits, only JSON 503s with Retry-After, one loan per intent',
    async ({ name, env }) => {
      const schema = uniqueName('rs_desk_pg_term');
      schemas.push(schema);
      const applicationName = uniqueName('rs_desk_term');
      const url = new URL(PG_URL);
      url.searchParams.set('schema', schema);
      url.searchParams.set('application_name', applicationName);
      const desk = await startLoanDesk({ workers: 2, env: { DATABASE_URL: url.toString(), ...env } });
      const admin = new pg.Client({ connectionString: PG_URL, application_name: `${applicationName}_admin` });
      await admin.connect();
      let terminated = 0;
      try {
        const { seen } = await flowThroughFault(
          desk,
          `loan desk on PostgreSQL, WORKERS=2, ${name}, backends terminated`,
          async () => {
            const until = Date.now() + TERMINATING_MS;
            while (Date.now() < until) {
              const { rows } = await admin.query<{ done: boolean }>(
                `SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity
               WHERE application_name = $1 AND datname = current_database()`,
                [applicationName],
              );
              terminated += rows.filter((row) => row.done).length;
              await sleep(40 + Math.random() * 60);
            }
          },
        );
        console.log(`terminated ${terminated} backends under ${seen.intents} intents`);
        expect(terminated).toBeGreaterThan(0);
      } finally {
        await admin.end();
        expect(await desk.stop()).toBe(0);
      }
    },
    90_000,
  );
});
