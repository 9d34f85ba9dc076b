import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AtomicWorkResult } from '../src/core/store.js';
import { type PostgresStore, postgresStore } from '../src/stores/postgres/index.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import { hasPgBouncer, type PgBouncer, startPgBouncer } from './support/pgbouncer.js';
import { postgresUnderTest } from './support/postgres-under-test.js';
import { dropSchemas, hasPostgres, uniqueName } from './support/services.js';
import { claimInput, textResponse } from './support/store-calls.js';

/**
 * The PostgreSQL store through Debian's PgBouncer in transaction pooling mode, started by the
 * tests on a loopback port: consecutive transactions of one client connection run on whichever
 * server session is free, so nothing of a session (prepared statements, SET, LISTEN) carries over.
 */
const available = hasPostgres && hasPgBouncer;

describe.skipIf(!available)('postgres behind PgBouncer (transaction pooling)', () => {
  // Fewer server sessions than the store has connections: every one is shared by several.
  describeStoreConformance('postgres behind PgBouncer (lease and atomic mode)', async () => {
    const bouncer = await startPgBouncer({ poolSize: 3 });
    return postgresUnderTest({ url: bouncer.url, pooling: 'transaction' }, () => bouncer.stop());
  });

  describe('specifics', () => {
    let bouncer: PgBouncer;
    const schema = uniqueName('rs_pgb');
    const stores: PostgresStore[] = [];
    const open = (options: { maxConnections?: number } = {}) => {
      const store = postgresStore({
        url: bouncer.url,
        schema,
        pooling: 'transaction',
        ...options,
      });
      stores.push(store);
      return store;
    };

    beforeAll(async () => {
      // One server session: every transaction of every client runs on it, so whatever a
      // transaction leaves on its session, the next one (anyone's) finds.
      bouncer = await startPgBouncer({ poolSize: 1 });
      await open().migrate();
    });

    afterAll(async () => {
      for (const store of stores) await store.close();
      await dropSchemas(schema);
      await bouncer?.stop();
    });

    it('without `pooling: transaction`, the refused startup parameters are a ConfigError naming the option', async () => {
      const direct = postgresStore({ url: bouncer.url, schema });
      try {
        await expect(direct.claim(claimInput('refused'))).rejects.toMatchObject({
          name: 'ConfigError',
          message: expect.stringContaining("pooling: 'transaction'"),
        });
        await expect(
          direct.atomic(claimInput('refused'), async () => ({ response: textResponse('x'), commit: true })),
        ).rejects.toMatchObject({ name: 'ConfigError' });
        await expect(direct.migrate()).rejects.toMatchObject({ name: 'ConfigError' });
      } finally {
        await direct.close();
      }
    });

    it('`connectionCheckIntervalMs` with transaction pooling is refused, naming the role setting', () => {
      expect(() =>
        postgresStore({
          url: bouncer.url,
          pooling: 'transaction',
          connectionCheckIntervalMs: 1000,
        }),
      ).toThrow(/ALTER ROLE/);
      expect(() => postgresStore({ url: bouncer.url, pooling: 'statement' as never })).toThrow(/`pooling`/);
    });

    it('leaves the shared server session as it found it: no prepared statement, no setting, no LISTEN', async () => {
      const store = open({ maxConnections: 4 });
      const lease = await store.claim(claimInput('lease'));
      if (lease.outcome !== 'acquired') throw new Error(lease.outcome);
      const waiting = store.wait('s', 'lease', 10_000);
      await store.complete('s', 'lease', lease.token, textResponse('lease'));
      await waiting;
      expect((await store.claim(claimInput('lease'))).outcome).toBe('replay');
      const work = async (): Promise<AtomicWorkResult> => ({
        response: textResponse('atomic'),
        commit: true,
      });
      expect((await store.atomic(claimInput('atomic'), work)).outcome).toBe('executed');
      expect((await store.atomic(claimInput('atomic'), work)).outcome).toBe('replay');
      await store.purgeExpired();
      await store.list();

      const client = new pg.Client({ connectionString: bouncer.url });
      await client.connect();
      try {
        const { rows } = await client.query(`SELECT
            (SELECT count(*)::int FROM pg_prepared_statements) AS prepared,
            (SELECT count(*)::int FROM pg_listening_channels()) AS listening,
            current_setting('statement_timeout') AS statement_timeout,
            current_setting('lock_timeout') AS lock_timeout`);
        expect(rows[0]).toEqual({ prepared: 0, listening: 0, statement_timeout: '0', lock_timeout: '0' });
      } finally {
        await client.end();
      }
    });

    // Four stores, as four app servers would be, each with a handful of connections: the
    // duplicates meet in PostgreSQL through the pooler, not in one store's memory.
    it('200 concurrent duplicates, atomic mode: one execution, 199 replays of it', async () => {
      const servers = Array.from({ length: 4 }, () => open({ maxConnections: 3 }));
      let runs = 0;
      const work = async (tx: pg.PoolClient): Promise<AtomicWorkResult> => {
        runs++;
        await tx.query('SELECT pg_sleep(0.2)');
        return { response: textResponse('the one'), commit: true };
      };
      const duplicate = { ...claimInput('hot-atomic'), waitMs: 20_000 };
      const results = await Promise.all(
        Array.from({ length: 200 }, (_, i) => servers[i % 4]!.atomic(duplicate, work)),
      );
      const outcomes = results.map((r) => r.outcome);
      expect(outcomes.filter((o) => o === 'executed')).toHaveLength(1);
      expect(outcomes.filter((o) => o === 'replay')).toHaveLength(199);
      expect(runs).toBe(1);
    });

    it('200 concurrent duplicate claims, lease mode: one acquired', async () => {
      const servers = Array.from({ length: 4 }, () => open({ maxConnections: 3 }));
      const results = await Promise.all(
        Array.from({ length: 200 }, (_, i) => servers[i % 4]!.claim(claimInput('hot-lease'))),
      );
      const outcomes = results.map((r) => r.outcome);
      expect(outcomes.filter((o) => o === 'acquired')).toHaveLength(1);
      expect(outcomes.filter((o) => o === 'in_progress')).toHaveLength(199);
    });
  });
});
