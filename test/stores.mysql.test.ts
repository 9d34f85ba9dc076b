import { setTimeout as sleep } from 'node:timers/promises';
import mysql, { type PoolConnection } from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AtomicResult } from '../src/core/contract/index.js';
import { type MysqlStore, mysqlMigrationSql, mysqlStore } from '../src/stores/mysql/index.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import { hasMysql, mysqlDatabase } from './support/services.js';
import { claimInput, textResponse } from './support/store-calls.js';

describe.skipIf(!hasMysql)('mysql', () => {
  describeStoreConformance('mysql (lease and atomic mode)', async () => {
    const database = await mysqlDatabase();
    const admin = mysql.createPool({ uri: database.url, connectionLimit: 2 });
    const store = mysqlStore({ url: database.url });
    await store.migrate();
    await admin.query('CREATE TABLE probe (id int AUTO_INCREMENT PRIMARY KEY)');
    return {
      store,
      atomicProbe: {
        async write(tx: PoolConnection) {
          await tx.query('INSERT INTO probe () VALUES ()');
        },
        async count() {
          const [rows] = await admin.query<mysql.RowDataPacket[]>('SELECT count(*) AS n FROM probe');
          return Number(rows[0]!.n);
        },
        async commit(tx: PoolConnection) {
          await tx.query('COMMIT');
        },
      },
      async cleanup() {
        await admin.end();
        await database.drop();
      },
    };
  });
});

describe.skipIf(!hasMysql)('mysql store specifics', () => {
  let database: Awaited<ReturnType<typeof mysqlDatabase>>;
  let store: MysqlStore;
  /** Pools of their own, as separate app servers would have. */
  const servers: MysqlStore[] = [];
  beforeAll(async () => {
    database = await mysqlDatabase();
    store = mysqlStore({ url: database.url });
    await store.migrate();
    await store.pool.query('CREATE TABLE effect (`key` varchar(64) NOT NULL)');
    for (let i = 0; i < 4; i++) servers.push(mysqlStore({ url: database.url, maxConnections: 5 }));
  });

  afterAll(async () => {
    for (const server of servers) await server.close();
    await store?.close();
    await database?.drop();
  });

  it('rejects bad options naming the option', () => {
    expect(() => mysqlStore({ url: database.url, table: 'a;drop' })).toThrow(/`table`/);
    expect(() => mysqlStore({} as never)).toThrow(/`pool` or `url`/);
    expect(() => mysqlStore({ url: database.url, maxConnections: 0 })).toThrow(/`maxConnections`/);
    expect(() => mysqlStore({ url: database.url, tabel: 'x' } as never)).toThrow(/table/);
  });

  it('migrate is idempotent, also when run concurrently', async () => {
    const other = mysqlStore({ url: database.url, table: 'other_keys' });
    try {
      await Promise.all([other.migrate(), other.migrate(), other.migrate()]);
      await other.migrate();
      const [rows] = await store.pool.query<mysql.RowDataPacket[]>(
        "SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = ? AND table_name = 'other_keys' ORDER BY 1",
        [database.name],
      );
      expect(rows.map((r) => r.index_name ?? r.INDEX_NAME)).toEqual([
        'other_keys_abandoned',
        'other_keys_expires_at_ms',
        'PRIMARY',
      ]);
    } finally {
      await other.close();
    }
  });

  it('of 100 concurrent claims of one new key from four app servers, exactly one acquires', async () => {
    for (let round = 0; round < 5; round++) {
      const results = await Promise.all(
        Array.from({ length: 100 }, (_, i) =>
          servers[i % servers.length]!.claim(claimInput(`race-${round}`)),
        ),
      );
      expect(results.filter((r) => r.outcome === 'acquired')).toHaveLength(1);
      expect(results.filter((r) => r.outcome === 'in_progress')).toHaveLength(99);
    }
  });

  it('of 50 concurrent takeovers of a passed lease, exactly one acquires and fences the old owner', async () => {
    const first = await store.claim(claimInput('takeover', 'f1', 100));
    expect(first.outcome).toBe('acquired');
    await sleep(250);
    const results = await Promise.all(
      Array.from({ length: 50 }, (_, i) => servers[i % servers.length]!.claim(claimInput('takeover'))),
    );
    const winners = results.filter((r) => r.outcome === 'acquired');
    expect(winners).toHaveLength(1);
    if (first.outcome !== 'acquired') return;
    expect(await store.complete('s', 'takeover', first.token, textResponse('stale'))).toBe(false);
  });

  it('the same race holds on a pool with FOUND_ROWS off and under SIMULTANEOUS_ASSIGNMENT', async () => {
    const pools = [
      mysql.createPool({ uri: database.url, connectionLimit: 5, flags: ['-FOUND_ROWS'] }),
      mysql.createPool({ uri: database.url, connectionLimit: 5 }),
    ];
    pools[1]!.on('connection', (connection) => {
      connection.query("SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')");
    });
    const stores = pools.map((pool) => mysqlStore({ pool }));
    try {
      const results = await Promise.all(
        Array.from({ length: 60 }, (_, i) => stores[i % 2]!.claim(claimInput('flags'))),
      );
      expect(results.filter((r) => r.outcome === 'acquired')).toHaveLength(1);
      for (const [i, own] of stores.entries()) {
        expect((await own.claim(claimInput(`flags-${i}`, 'f1', 100))).outcome).toBe('acquired');
        await sleep(250);
        expect((await own.claim(claimInput(`flags-${i}`))).outcome).toBe('acquired');
        // The takeover wrote every column, not only the token: the lease is live again.
        expect((await own.claim(claimInput(`flags-${i}`))).outcome).toBe('in_progress');
        expect((await own.get('s', `flags-${i}`))?.leaseUntilMs).toBeGreaterThan(Date.now() + 5000);
      }
    } finally {
      for (const own of stores) await own.close();
      for (const pool of pools) await pool.end();
    }
  });

  it('stores times from the database clock in milliseconds', async () => {
    const before = Date.now();
    expect((await store.claim(claimInput('clock'))).outcome).toBe('acquired');
    const record = await store.get('s', 'clock');
    // The database runs on this machine: its clock and ours agree within a second.
    expect(Math.abs(record!.createdAtMs - before)).toBeLessThan(1000);
    expect(record!.leaseUntilMs! - record!.createdAtMs).toBe(10_000);
    expect(record!.expiresAtMs - record!.createdAtMs).toBe(60_000);
  });

  it('keeps keys that the default collations would merge apart: case and trailing spaces', async () => {
    for (const key of ['Case', 'case', 'case ', 'cäse']) {
      expect((await store.claim(claimInput(key))).outcome).toBe('acquired');
    }
  });

  it('works on a pool the caller owns and leaves it open', async () => {
    const pool = mysql.createPool({ uri: database.url, connectionLimit: 2 });
    const own = mysqlStore({ pool });
    try {
      expect(own.pool).toBe(pool);
      expect((await own.claim(claimInput('own-pool'))).outcome).toBe('acquired');
      await own.close();
      const [rows] = await pool.query<mysql.RowDataPacket[]>('SELECT 1 AS one');
      expect(rows[0]).toEqual({ one: 1 });
    } finally {
      await pool.end();
    }
  });

  it('round trips per claim and completion: 2 in lease mode, 7 in atomic mode with one write', async () => {
    // One connection, so the server's per-session statement count is the store's round trips
    // (each a statement: mysql2 sends START TRANSACTION and COMMIT as queries too).
    const pool = mysql.createPool({ uri: database.url, connectionLimit: 1 });
    const own = mysqlStore({ pool });
    // The count includes the SHOW that reads it.
    const statements = async () => {
      const [rows] = await pool.query<mysql.RowDataPacket[]>("SHOW SESSION STATUS LIKE 'Questions'");
      return Number(rows[0]!.Value);
    };
    const roundTrips = async (call: () => Promise<unknown>) => {
      const before = await statements();
      await call();
      return (await statements()) - before - 1;
    };
    try {
      await own.claim(claimInput('warm-up'));
      const lease = await roundTrips(async () => {
        const claimed = await own.claim(claimInput('rt-lease'));
        if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
        expect(await own.complete('s', 'rt-lease', claimed.token, textResponse('ok'))).toBe(true);
      });
      // The claim (no read-back: it inserted the row) and the completion.
      expect(lease).toBe(2);
      // A duplicate: the claim met a row, which one more statement reads.
      expect(await roundTrips(() => own.claim(claimInput('rt-lease')))).toBe(2);
      const atomic = await roundTrips(() =>
        own.atomic(claimInput('rt-atomic'), async (tx) => {
          await tx.query('INSERT INTO effect (`key`) VALUES (?)', ['rt-atomic']);
          return { response: textResponse('ok'), commit: true };
        }),
      );
      // SET lock wait, START TRANSACTION, claim, SET lock wait back, the write, complete, COMMIT.
      expect(atomic).toBe(7);
    } finally {
      await own.close();
      await pool.end();
    }
  });

  describe('atomic mode', () => {
    const effects = async (key: string) => {
      const [rows] = await store.pool.query<mysql.RowDataPacket[]>(
        'SELECT count(*) AS n FROM effect WHERE `key` = ?',
        [key],
      );
      return Number(rows[0]!.n);
    };
    const writing =
      (key: string, holdMs = 0) =>
      async (tx: PoolConnection) => {
        await tx.query('INSERT INTO effect (`key`) VALUES (?)', [key]);
        await sleep(holdMs);
        return { response: textResponse(`done ${key}`), commit: true };
      };

    it('duplicates on four app servers block on the row lock, then replay the one commit', async () => {
      const key = 'atomic-race';
      const results = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          servers[i % servers.length]!.atomic(claimInput(key), writing(key, 50)),
        ),
      );
      expect(results.filter((r) => r.outcome === 'executed')).toHaveLength(1);
      for (const result of results.filter((r) => r.outcome !== 'executed')) {
        expect(result.outcome).toBe('replay');
      }
      expect(await effects(key)).toBe(1);
    });

    it('a duplicate proceeds when the first rolls back', async () => {
      const key = 'atomic-rollback';
      const first = servers[0]!.atomic(claimInput(key), async (tx) => {
        await tx.query('INSERT INTO effect (`key`) VALUES (?)', [key]);
        await sleep(200);
        throw new Error('handler failed');
      });
      await sleep(50);
      const second = servers[1]!.atomic(claimInput(key), writing(key));
      await expect(first).rejects.toThrow('handler failed');
      expect((await second).outcome).toBe('executed');
      expect(await effects(key)).toBe(1);
    });

    it('a duplicate blocked longer than its wait answers in_progress without running', async () => {
      const key = 'atomic-blocked';
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      const first = servers[0]!.atomic(claimInput(key), async (tx) => {
        await tx.query('INSERT INTO effect (`key`) VALUES (?)', [key]);
        await held;
        return { response: textResponse('first'), commit: true };
      });
      await sleep(50);
      let ran = false;
      const second: AtomicResult = await servers[1]!.atomic({ ...claimInput(key), waitMs: 500 }, async () => {
        ran = true;
        return { response: textResponse('second'), commit: true };
      });
      expect(second).toEqual({ outcome: 'in_progress', retryAfterMs: 1000 });
      expect(ran).toBe(false);
      release();
      expect((await first).outcome).toBe('executed');
      expect(await effects(key)).toBe(1);
    });

    it('fails within timeoutMs when the pool has no connection to give, and runs nothing', async () => {
      const pool = mysql.createPool({ uri: database.url, connectionLimit: 1 });
      const own = mysqlStore({ pool });
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      try {
        const first = own.atomic(claimInput('pool-held'), async () => {
          await held;
          return { response: textResponse('first'), commit: true };
        });
        await sleep(100);
        let ran = false;
        await expect(
          own.atomic({ ...claimInput('pool-starved'), timeoutMs: 300 }, async () => {
            ran = true;
            return { response: textResponse('second'), commit: true };
          }),
        ).rejects.toThrow(/no pool connection within (29[0-9]|300) ms/);
        expect(ran).toBe(false);
        release();
        expect((await first).outcome).toBe('executed');
        // The connection that came too late went back to the pool: the next call gets it.
        expect(
          (
            await own.atomic(claimInput('pool-starved'), async () => ({
              response: textResponse('x'),
              commit: true,
            }))
          ).outcome,
        ).toBe('executed');
      } finally {
        release();
        await own.close();
        await pool.end();
      }
    });

    it('fails past its bound when the key table is locked, runs nothing, and discards the connection', async () => {
      const pool = mysql.createPool({ uri: database.url, connectionLimit: 1 });
      const own = mysqlStore({ pool, table: 'locked_keys' });
      const locker = await mysql.createConnection({ uri: database.url });
      try {
        await own.migrate();
        // A table lock is no row lock: InnoDB's lock wait, which `waitMs` sets, does not bound it.
        await locker.query('LOCK TABLES locked_keys WRITE');
        let ran = false;
        await expect(
          own.atomic({ ...claimInput('locked'), timeoutMs: 300, waitMs: 500 }, async () => {
            ran = true;
            return { response: textResponse('x'), commit: true };
          }),
        ).rejects.toMatchObject({ code: 'PROTOCOL_SEQUENCE_TIMEOUT' });
        expect(ran).toBe(false);
        await locker.query('UNLOCK TABLES');
        // The pool's one connection, its claim possibly still queued on the server, was destroyed:
        // the next call runs on a new one.
        expect((await own.atomic(claimInput('locked'), writing('locked'))).outcome).toBe('executed');
        expect(await effects('locked')).toBe(1);
      } finally {
        await locker.end();
        await own.close();
        await pool.end();
      }
    });

    it('leaves the session lock wait as it found it for the handler', async () => {
      const pool = mysql.createPool({ uri: database.url, connectionLimit: 1 });
      const own = mysqlStore({ pool });
      try {
        const [[before]] = await pool.query<mysql.RowDataPacket[]>('SELECT @@innodb_lock_wait_timeout AS s');
        let inside: unknown;
        await own.atomic({ ...claimInput('lock-wait'), waitMs: 3000 }, async (tx) => {
          const [[row]] = await tx.query<mysql.RowDataPacket[]>('SELECT @@innodb_lock_wait_timeout AS s');
          inside = row!.s;
          return { response: textResponse('ok'), commit: true };
        });
        expect(inside).toBe(before!.s);
      } finally {
        await own.close();
        await pool.end();
      }
    });
  });

  it('fails every call with a ConfigError naming `retrysafe migrate`, then works once migrated', async () => {
    const missing = mysqlStore({ url: database.url, table: 'missing_keys' });
    try {
      for (const call of [
        () => missing.claim(claimInput('k')),
        () => missing.get('s', 'k'),
        () => missing.list(),
        () => missing.purgeExpired(),
        () => missing.atomic(claimInput('k'), async () => ({ response: textResponse('x'), commit: true })),
      ]) {
        await expect(call()).rejects.toThrow(/retrysafe migrate/);
      }
      await missing.migrate();
      expect((await missing.claim(claimInput('k'))).outcome).toBe('acquired');
    } finally {
      await missing.close();
    }
  });

  it('`migrate: true` creates the table on first use, in atomic mode on a one-connection pool too', async () => {
    const pool = mysql.createPool({ uri: database.url, connectionLimit: 1 });
    const auto = mysqlStore({ pool, table: 'auto_keys', migrate: true });
    try {
      const result = await auto.atomic(claimInput('auto'), async () => ({
        response: textResponse('x'),
        commit: true,
      }));
      expect(result.outcome).toBe('executed');
      expect((await auto.claim(claimInput('auto'))).outcome).toBe('replay');
    } finally {
      await auto.close();
      await pool.end();
    }
  });

  it('migrate adds the step columns to a table made before steps, keeping its records', async () => {
    const [create] = mysqlMigrationSql({ table: 'old_keys' });
    // The table as the release before steps made it.
    await store.pool.query(
      create!
        .replace(/\n {2}steps [^\n]*|\n {2}request [^\n]*/g, '')
        .replace(/,\n {2}INDEX `old_keys_abandoned`[^\n]*/, ''),
    );
    const old = mysqlStore({ url: database.url, table: 'old_keys' });
    const auto = mysqlStore({ url: database.url, table: 'old_keys', migrate: true });
    try {
      await store.pool.query(
        "INSERT INTO old_keys (scope, `key`, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms) VALUES ('s', 'kept', 'f1', 't', 0, 0, 9999999999999)",
      );
      await expect(old.claim(claimInput('k'))).rejects.toThrow(/retrysafe migrate/);
      const claimed = await auto.claim(claimInput('k', 'f1', 100));
      expect(claimed.outcome).toBe('acquired');
      if (claimed.outcome !== 'acquired') return;
      expect(await auto.saveStep('s', 'k', claimed.token, { name: 'one', value: '1' }, 'req')).toBe(true);
      await old.migrate();
      expect((await old.get('s', 'k'))?.steps).toEqual(['one']);
      expect((await old.get('s', 'kept'))?.state).toBe('in_progress');
    } finally {
      await old.close();
      await auto.close();
    }
  });

  it('prints the statement migrate runs', () => {
    const [statement] = mysqlMigrationSql({ table: 'keys' });
    expect(statement).toMatch(/CREATE TABLE IF NOT EXISTS `keys`/);
    expect(statement).toMatch(/varbinary/);
    expect(() => mysqlMigrationSql({ table: 'bad name' })).toThrow(/`table`/);
  });
});
