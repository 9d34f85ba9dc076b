import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type PostgresStore, postgresStore } from '../src/stores/postgres/index.js';
import { pgDriver } from '../src/stores/sql/drivers/pg.js';
import { describeIdempotentConformance } from '../src/testing/idempotent-suite.js';
import { signal } from '../src/testing/signal.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import { describeSqlDriverConformance } from './conformance/sql-driver-suite.js';
import { postgresUnderTest } from './support/postgres-under-test.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';
import { claimInput, textResponse } from './support/store-calls.js';

describe.skipIf(!hasPostgres)('postgres', () => {
  const postgresWithProbe = () => postgresUnderTest();
  describeStoreConformance('postgres (lease and atomic mode)', postgresWithProbe);
  describeIdempotentConformance('postgres', postgresWithProbe);
});

describe.skipIf(!hasPostgres)('pg driver', () => {
  describeSqlDriverConformance('postgres', async () => {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 4 });
    const driver = pgDriver(pool, { prepared: true, listen: true, connectTimeoutMs: 5000 });
    return {
      driver,
      // Through the driver, which sends the transaction's BEGIN with its first statement.
      async nested(tx, work) {
        await driver.queryIn(tx, 'SAVEPOINT nested', []);
        try {
          await work(tx);
        } catch (error) {
          await tx.query('ROLLBACK TO SAVEPOINT nested');
          throw error;
        }
        await tx.query('RELEASE SAVEPOINT nested');
      },
      async close() {
        await driver.close();
        await pool.end();
      },
    };
  });
});

describe.skipIf(!hasPostgres)('postgres store specifics', () => {
  const schema = uniqueName('rs_pg');
  let admin: pg.Client;
  let store: PostgresStore;
  beforeAll(async () => {
    admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    store = postgresStore({ url: PG_URL, schema });
    await store.migrate();
    await admin.query(`CREATE TABLE "${schema}".effect (key text NOT NULL)`);
  });

  afterAll(async () => {
    await store?.close();
    await admin?.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin?.end();
  });

  it('rejects bad options naming the option', () => {
    expect(() => postgresStore({ url: PG_URL, schema: 'a;drop' })).toThrow(/`schema`/);
    expect(() => postgresStore({} as never)).toThrow(/`pool` or `url`/);
    expect(() => postgresStore({ url: PG_URL, statementTimeoutMs: 0 })).toThrow(/`statementTimeoutMs`/);
    expect(() => postgresStore({ url: PG_URL, connectionCheckIntervalMs: -1 })).toThrow(
      /`connectionCheckIntervalMs`/,
    );
  });

  it("its own pool's backends check for a client that died (client_connection_check_interval)", async () => {
    const { rows } = await store.pool.query('SHOW client_connection_check_interval');
    expect(rows[0].client_connection_check_interval).toBe('1s');
    const off = postgresStore({ url: PG_URL, schema, connectionCheckIntervalMs: 0 });
    try {
      expect((await off.pool.query('SHOW client_connection_check_interval')).rows[0]).toEqual({
        client_connection_check_interval: '0',
      });
    } finally {
      await off.close();
    }
  });

  it('migrate is idempotent, also when run concurrently', async () => {
    const other = postgresStore({ url: PG_URL, schema: `${schema}_m`, table: 'keys' });
    try {
      await Promise.all([other.migrate(), other.migrate(), other.migrate()]);
      await other.migrate();
      const { rows } = await admin.query(
        `SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'keys' ORDER BY 1`,
        [`${schema}_m`],
      );
      expect(rows.map((r) => r.indexname)).toEqual(['keys_abandoned', 'keys_expires_at_ms', 'keys_pkey']);
    } finally {
      await other.close();
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}_m" CASCADE`);
    }
  });

  it('works on a pool the caller owns and leaves it open', async () => {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
    const own = postgresStore({ pool, schema });
    try {
      expect(own.pool).toBe(pool);
      expect((await own.claim(claimInput('own-pool'))).outcome).toBe('acquired');
      await own.close();
      expect((await pool.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    } finally {
      await pool.end();
    }
  });

  /** Runs `test` on a store over a pool of one connection (so every call shares it), then closes both. */
  async function onOneConnection(test: (own: PostgresStore, pool: pg.Pool) => Promise<void>): Promise<void> {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 1 });
    const own = postgresStore({ pool, schema });
    try {
      await test(own, pool);
    } finally {
      await own.close();
      await pool.end();
    }
  }

  it('answers an atomic replay after one round trip, its transaction left clean for the next user', async () => {
    const work = async () => ({ response: textResponse('once'), commit: true });
    await onOneConnection(async (own, pool) => {
      expect((await own.atomic(claimInput('one-trip'), work)).outcome).toBe('executed');
      // The pool's one connection, with its answered queries counted.
      const client = await pool.connect();
      const query = client.query.bind(client) as (...args: unknown[]) => Promise<unknown> | undefined;
      let answered = 0;
      client.query = ((...args: unknown[]) => {
        const last = args[args.length - 1];
        // pool.query passes a callback; the store awaits promises.
        if (typeof last === 'function') {
          return query(...args.slice(0, -1), (...results: unknown[]) => {
            answered++;
            last(...results);
          });
        }
        const result = query(...args) as Promise<unknown>;
        result.then(
          () => answered++,
          () => answered++,
        );
        return result;
      }) as typeof client.query;
      client.release();
      const replay = await own.atomic(claimInput('one-trip'), work);
      expect(replay.outcome).toBe('replay');
      expect(answered).toBe(1);
      // Outside a transaction every statement is one of its own.
      const { rows } = await pool.query(
        'SELECT xact_start = query_start AS own FROM pg_stat_activity WHERE pid = pg_backend_pid()',
      );
      expect(rows).toEqual([{ own: true }]);
      expect(answered).toBe(3);
    });
  });

  // What a transaction-mode pooler does: the next transaction lands on a server connection that
  // never saw our SQL-level PREPARE (protocol-level statements it keeps; pg cannot recover those).
  it('prepares its atomic statements again when the connection lost them', async () => {
    const work = async () => ({ response: textResponse('ok'), commit: true });
    await onOneConnection(async (own, pool) => {
      expect((await own.atomic(claimInput('discard-1'), work)).outcome).toBe('executed');
      const { rows } = await pool.query<{ name: string }>(
        'SELECT name FROM pg_prepared_statements WHERE from_sql',
      );
      expect(rows.length).toBeGreaterThan(0);
      for (const { name } of rows) await pool.query(`DEALLOCATE ${name}`);
      expect((await own.atomic(claimInput('discard-2'), work)).outcome).toBe('executed');
      expect((await own.claim(claimInput('discard-2'))).outcome).toBe('replay');
    });
  });

  it('stores times from the database clock in milliseconds', async () => {
    const claimed = await store.claim(claimInput('clock'));
    expect(claimed.outcome).toBe('acquired');
    const { rows } = await admin.query(
      `SELECT lease_until_ms - created_at_ms AS lease_ms, expires_at_ms - created_at_ms AS ttl_ms,
        abs(created_at_ms - (extract(epoch FROM now()) * 1000)) < 60000 AS recent
       FROM "${schema}".idempotency_keys WHERE key = 'clock'`,
    );
    expect(rows[0]).toEqual({ lease_ms: '10000', ttl_ms: '60000', recent: true });
  });

  it('replays binary bodies byte for byte', async () => {
    const body = new Uint8Array([0, 255, 1, 128, 10, 13, 0]);
    const claimed = await store.claim(claimInput('binary'));
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    expect(await store.complete('s', 'binary', claimed.token, { status: 200, headers: {}, body })).toBe(true);
    const replay = await store.claim(claimInput('binary'));
    expect(replay.outcome === 'replay' && [...replay.response.body]).toEqual([...body]);
  });

  it('wakes a waiter through LISTEN/NOTIFY on one listening connection', async () => {
    const claimed = await store.claim(claimInput('notify'));
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    let settled = false;
    const waiting = store.wait('s', 'notify', 20_000).then(() => {
      settled = true;
    });
    const channel = `retrysafe_${createHash('sha1').update(`"${schema}"."idempotency_keys"`).digest('hex').slice(0, 12)}`;
    const listeners = async () =>
      (
        await admin.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE query = $1', [
          `LISTEN "${channel}"`,
        ])
      ).rows[0].n;
    for (let attempt = 0; attempt < 50 && (await listeners()) === 0; attempt++) await sleep(100);
    expect(await listeners()).toBe(1);
    expect(settled).toBe(false);
    await store.complete('s', 'notify', claimed.token, textResponse('done'));
    await waiting;
    expect(settled).toBe(true);
  });

  describe('atomic mode', () => {
    const effects = async (key: string) =>
      Number(
        (await admin.query(`SELECT count(*) FROM "${schema}".effect WHERE key = $1`, [key])).rows[0].count,
      );

    it('commits the claim, the handler writes and the response together', async () => {
      const result = await store.atomic(claimInput('a1'), async (tx) => {
        await tx.query(`INSERT INTO "${schema}".effect VALUES ('a1')`);
        return { response: textResponse('one'), commit: true };
      });
      expect(result).toMatchObject({ outcome: 'executed', committed: true });
      expect(await effects('a1')).toBe(1);
      const again = await store.atomic(claimInput('a1'), async () => {
        throw new Error('must not run');
      });
      expect(again.outcome === 'replay' && new TextDecoder().decode(again.response.body)).toBe('one');
    });

    // No one can wait on such a record: no other transaction ever sees it in progress. And a
    // NOTIFY takes a database-wide lock at commit that serialises every notifying commit.
    it('commits without a notification, unlike a lease-mode completion', async () => {
      const channel = `retrysafe_${createHash('sha1').update(`"${schema}"."idempotency_keys"`).digest('hex').slice(0, 12)}`;
      const listener = new pg.Client({ connectionString: PG_URL });
      await listener.connect();
      try {
        const first = new Promise<string | undefined>((resolve) =>
          listener.once('notification', (message) => resolve(message.payload)),
        );
        await listener.query(`LISTEN "${channel}"`);
        const atomic = await store.atomic(claimInput('quiet'), async (tx) => {
          await tx.query(`INSERT INTO "${schema}".effect VALUES ('quiet')`);
          return { response: textResponse('quiet'), commit: true };
        });
        expect(atomic).toMatchObject({ outcome: 'executed', committed: true });
        const claimed = await store.claim(claimInput('loud'));
        if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
        await store.complete('s', 'loud', claimed.token, textResponse('loud'));
        // Notifications arrive in commit order: the atomic one, had it been sent, would come first.
        expect(await first).toBe(createHash('sha1').update('s').update('\0').update('loud').digest('base64'));
      } finally {
        await listener.end();
      }
    });

    it('a concurrent duplicate blocks until the first commits, then replays', async () => {
      const { promise: gate, resolve: release } = signal();
      const { promise: inside, resolve: entered } = signal();
      const first = store.atomic(claimInput('a2'), async (tx) => {
        await tx.query(`INSERT INTO "${schema}".effect VALUES ('a2')`);
        entered();
        await gate;
        return { response: textResponse('first'), commit: true };
      });
      await inside;
      let secondRan = false;
      const second = store.atomic(claimInput('a2'), async () => {
        secondRan = true;
        return { response: textResponse('second'), commit: true };
      });
      await new Promise((resolve) => setTimeout(resolve, 200));
      release();
      const [a, b] = await Promise.all([first, second]);
      expect(a.outcome).toBe('executed');
      expect(b.outcome === 'replay' && new TextDecoder().decode(b.response.body)).toBe('first');
      expect(secondRan).toBe(false);
      expect(await effects('a2')).toBe(1);
    });

    // The duplicates of a hot key queued for the pool's clients while the first held one, and a
    // queue wait past the pool's connect timeout answered 503 (seen under 1,000 duplicates).
    it('a hot key on a small pool: 300 concurrent duplicates replay the one commit', async () => {
      const own = postgresStore({
        url: PG_URL,
        schema,
        maxConnections: 2,
        connectTimeoutMs: 250,
      });
      let runs = 0;
      const work = async (tx: pg.PoolClient) => {
        runs++;
        await tx.query(`INSERT INTO "${schema}".effect VALUES ('hot')`);
        // Longer than the connect timeout: a duplicate queued for a client meanwhile times out.
        await sleep(750);
        return { response: textResponse('first'), commit: true };
      };
      try {
        const results = await Promise.allSettled(
          Array.from({ length: 300 }, () => own.atomic(claimInput('hot'), work)),
        );
        const shapes = results.map((r) =>
          r.status === 'rejected'
            ? `rejected: ${(r.reason as Error).message}`
            : r.value.outcome === 'executed' || r.value.outcome === 'replay'
              ? `ok: ${new TextDecoder().decode(r.value.response.body)}`
              : r.value.outcome,
        );
        expect(new Set(shapes)).toEqual(new Set(['ok: first']));
        expect(
          results.filter((r) => r.status === 'fulfilled' && r.value.outcome === 'executed'),
        ).toHaveLength(1);
        expect(runs).toBe(1);
        expect(await effects('hot')).toBe(1);
      } finally {
        await own.close();
      }
    }, 30_000);

    it('a duplicate blocked longer than its lease answers in_progress without running', async () => {
      const { promise: gate, resolve: release } = signal();
      const { promise: inside, resolve: entered } = signal();
      const first = store.atomic(claimInput('a5'), async () => {
        entered();
        await gate;
        return { response: textResponse('first'), commit: true };
      });
      await inside;
      let secondRan = false;
      const second = await store.atomic({ ...claimInput('a5'), leaseMs: 200 }, async () => {
        secondRan = true;
        return { response: textResponse('second'), commit: true };
      });
      release();
      expect(second.outcome).toBe('in_progress');
      expect(second.outcome === 'in_progress' && second.retryAfterMs).toBeGreaterThan(0);
      expect(secondRan).toBe(false);
      expect((await first).outcome).toBe('executed');
    });

    it('saves any bytes and headers with the commit, and replays them byte for byte', async () => {
      const body = Uint8Array.from({ length: 512 }, (_, i) => i % 256);
      const headers = { 'content-type': 'text/x-it\'s \\ "quoted" 😀', etag: 'W/"e\\0"' };
      const result = await store.atomic(claimInput('a6'), async () => ({
        response: { status: 201, headers, body },
        commit: true,
      }));
      expect(result).toMatchObject({ outcome: 'executed', committed: true });
      const replay = await store.claim(claimInput('a6'));
      expect(replay.outcome === 'replay' && replay.response).toEqual({
        status: 201,
        headers,
        body: Buffer.from(body),
      });
    });

    it('work that outlives the record commits nothing, its own writes included', async () => {
      await expect(
        store.atomic({ ...claimInput('a7'), leaseMs: 50, retainMs: 50 }, async (tx) => {
          await tx.query(`INSERT INTO "${schema}".effect VALUES ('a7')`);
          await sleep(150);
          return { response: textResponse('late'), commit: true };
        }),
      ).rejects.toThrow('the atomic claim was lost before commit');
      expect(await effects('a7')).toBe(0);
      const { rowCount } = await admin.query(`SELECT 1 FROM "${schema}".idempotency_keys WHERE key = 'a7'`);
      expect(rowCount).toBe(0);
    });

    it('a duplicate proceeds when the first rolls back; commit:false and throws leave nothing', async () => {
      const rolledBack = await store.atomic(claimInput('a3'), async (tx) => {
        await tx.query(`INSERT INTO "${schema}".effect VALUES ('a3')`);
        return { response: textResponse('oops', 500), commit: false };
      });
      expect(rolledBack).toMatchObject({ outcome: 'executed', committed: false });
      await expect(
        store.atomic(claimInput('a3'), async (tx) => {
          await tx.query(`INSERT INTO "${schema}".effect VALUES ('a3')`);
          throw new Error('handler failed');
        }),
      ).rejects.toThrow('handler failed');
      expect(await effects('a3')).toBe(0);
      const { rowCount } = await admin.query(`SELECT 1 FROM "${schema}".idempotency_keys WHERE key = 'a3'`);
      expect(rowCount).toBe(0);
      const third = await store.atomic(claimInput('a3'), async (tx) => {
        await tx.query(`INSERT INTO "${schema}".effect VALUES ('a3')`);
        return { response: textResponse('ok'), commit: true };
      });
      expect(third.outcome).toBe('executed');
      expect(await effects('a3')).toBe(1);
    });

    it('a crash mid-transaction leaves no orphaned in-progress row', async () => {
      await expect(
        store.atomic(claimInput('a4'), async (tx) => {
          await tx.query(`INSERT INTO "${schema}".effect VALUES ('a4')`);
          const { rows } = await tx.query('SELECT pg_backend_pid() AS pid');
          await admin.query('SELECT pg_terminate_backend($1)', [rows[0].pid]);
          await tx.query('SELECT 1');
          return { response: textResponse('never'), commit: true };
        }),
      ).rejects.toThrow();
      expect(await effects('a4')).toBe(0);
      expect((await store.claim(claimInput('a4'))).outcome).toBe('acquired');
    });

    // A backend terminated just after it said ReadyForQuery: both messages arrive in one read, so
    // pg hands the client out and, in the same tick, emits the FATAL on it as an 'error' event,
    // before any code awaiting `pool.connect()` resumes. Unheard, that event kills the process.
    it('a connection dropped as the pool hands it out fails the call, not the process', async () => {
      const pool = new pg.Pool({ connectionString: PG_URL, max: 1 });
      let unheard = 0;
      let dropNext = true;
      type Callback = (error: Error | undefined, client?: pg.PoolClient, done?: () => void) => void;
      const connect = pool.connect.bind(pool) as (callback: Callback) => void;
      pool.connect = ((callback?: Callback) => {
        let settle: Callback = () => {};
        const handedOut = new Promise<pg.PoolClient>((resolve, reject) => {
          settle = (error, client) => (error ? reject(error) : resolve(client!));
        });
        connect((error, client, done) => {
          (callback ?? settle)(error, client, done);
          if (!client || !dropNext) return;
          dropNext = false;
          const fatal = Object.assign(new Error('terminating connection due to administrator command'), {
            code: '57P01',
          });
          try {
            // What pg does with that FATAL: the client stops taking queries and emits 'error'.
            (client as unknown as { _handleErrorEvent(error: Error): void })._handleErrorEvent(fatal);
          } catch {
            unheard++;
          }
        });
        return callback ? undefined : handedOut;
      }) as typeof pool.connect;
      const own = postgresStore({ pool, schema });
      const work = async () => ({ response: textResponse('ok'), commit: true });
      try {
        await expect(own.atomic(claimInput('dropped-on-hand-out'), work)).rejects.toThrow();
        expect(unheard).toBe(0);
        expect((await own.atomic(claimInput('dropped-on-hand-out'), work)).outcome).toBe('executed');
      } finally {
        await own.close();
        await pool.end();
      }
    });
  });
});

describe.skipIf(!hasPostgres)('postgres store without its table', () => {
  const schema = uniqueName('rs_pg_nomig');
  const admin = new pg.Pool({ connectionString: PG_URL, max: 1 });
  afterAll(async () => {
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.end();
  });

  it('fails every call with a ConfigError naming `retrysafe migrate`, then works once migrated', async () => {
    const store = postgresStore({ url: PG_URL, schema, maxConnections: 1 });
    try {
      const calls = [
        () => store.claim(claimInput('k')),
        () => store.complete('s', 'k', 't', textResponse('x')),
        () => store.release('s', 'k', 't'),
        () => store.renew('s', 'k', 't', 1000),
        () => store.wait('s', 'k', 1000),
        () => store.purgeExpired(),
        () => store.list(),
        () => store.get('s', 'k'),
        () => store.delete('s', 'k'),
        () => store.atomic(claimInput('k'), async () => ({ response: textResponse('x'), commit: true })),
      ];
      for (const call of calls) {
        const error = await call().then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(error).toMatchObject({ name: 'ConfigError' });
        expect((error as Error).message).toContain(`"${schema}"."idempotency_keys"`);
        expect((error as Error).message).toContain('retrysafe migrate');
      }
      await store.migrate();
      // The same connection, whose named statements failed to parse before, now runs them.
      expect((await store.claim(claimInput('k'))).outcome).toBe('acquired');
      expect(
        (await store.atomic(claimInput('k2'), async () => ({ response: textResponse('x'), commit: true })))
          .outcome,
      ).toBe('executed');
    } finally {
      await store.close();
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    }
  });

  it("leaves a handler's own missing-table error as it is in atomic mode", async () => {
    const store = postgresStore({ url: PG_URL, schema, maxConnections: 1 });
    try {
      await store.migrate();
      await expect(
        store.atomic(claimInput('own'), async (tx) => {
          await tx.query(`INSERT INTO "${schema}".no_such_table VALUES (1)`);
          return { response: textResponse('x'), commit: true };
        }),
      ).rejects.toMatchObject({ code: '42P01' });
    } finally {
      await store.close();
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    }
  });

  it('creates schema, table and index on first use with `migrate: true`', async () => {
    const store = postgresStore({ url: PG_URL, schema, migrate: true });
    try {
      const claims = await Promise.all([
        store.claim(claimInput('a')),
        store.claim(claimInput('a')),
        store.claim(claimInput('b')),
      ]);
      expect(claims.map((c) => c.outcome).sort()).toEqual(['acquired', 'acquired', 'in_progress']);
      const { rows } = await admin.query(
        'SELECT indexname FROM pg_indexes WHERE schemaname = $1 ORDER BY 1',
        [schema],
      );
      expect(rows.map((r) => r.indexname)).toEqual([
        'idempotency_keys_abandoned',
        'idempotency_keys_expires_at_ms',
        'idempotency_keys_pkey',
      ]);
    } finally {
      await store.close();
    }
  });

  it('`migrate: true` in atomic mode migrates on the connection it holds (a one-connection pool too)', async () => {
    const own = `${schema}_atomic`;
    const store = postgresStore({ url: PG_URL, schema: own, migrate: true, maxConnections: 1 });
    try {
      const work = async () => ({ response: textResponse('x'), commit: true });
      expect((await store.atomic(claimInput('a'), work)).outcome).toBe('executed');
      expect((await store.claim(claimInput('a'))).outcome).toBe('replay');
    } finally {
      await store.close();
      await admin.query(`DROP SCHEMA IF EXISTS "${own}" CASCADE`);
    }
  }, 15_000);
});
