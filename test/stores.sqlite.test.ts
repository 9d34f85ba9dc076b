import { executionAsyncId } from 'node:async_hooks';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ClaimInput, StoredResponse } from '../src/core/contract/index.js';
import {
  isBusyError,
  NODE_SQLITE_MIN_VERSION,
  nodeSqliteAvailable,
  openDatabase,
} from '../src/stores/sqlite/driver.js';
import {
  type SqliteDatabase,
  type SqliteDriverName,
  type SqliteStore,
  sqliteStore,
} from '../src/stores/sqlite/index.js';
import { describeIdempotentConformance } from '../src/testing/idempotent-suite.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import { holdSqliteWriteLock } from './support/sqlite-locker.js';
import { sqliteRows } from './support/sqlite-rows.js';
import { expectWaitWokenBy } from './support/store-calls.js';

const dirs: string[] = [];
function tempFile(name = 'store.db'): string {
  const dir = mkdtempSync(join(tmpdir(), 'retrysafe-sqlite-'));
  dirs.push(dir);
  return join(dir, name);
}
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** Both drivers where this Node has them; node:sqlite says loudly why it is skipped on an older Node. */
const DRIVERS: SqliteDriverName[] = ['better-sqlite3'];
if (nodeSqliteAvailable()) DRIVERS.push('node:sqlite');
else {
  console.warn(
    `\n!!!!!!!! SKIPPING node:sqlite TESTS: the node:sqlite driver needs Node ≥ ${NODE_SQLITE_MIN_VERSION}, this is ${process.version} !!!!!!!!\n`,
  );
}

for (const driver of DRIVERS) {
  /** A store on a file of its own, with a table for the atomic-mode tests to write to. */
  const withProbe = async () => {
    const store = sqliteStore({ url: tempFile(), driver, migrate: true });
    store.database.exec('CREATE TABLE probe (id INTEGER PRIMARY KEY)');
    return {
      store,
      atomicProbe: {
        write: (db: SqliteDatabase) => void db.prepare('INSERT INTO probe DEFAULT VALUES').run(),
        count: async () =>
          (store.database.prepare('SELECT count(*) AS n FROM probe').get() as { n: number }).n,
        commit: (db: SqliteDatabase) => void db.exec('COMMIT'),
      },
    };
  };
  describeStoreConformance(`sqlite ${driver} (file, atomic probe)`, withProbe);
  describeIdempotentConformance(`sqlite ${driver}`, withProbe);

  describeStoreConformance(`sqlite ${driver} (caller-owned connection, custom table)`, async () => {
    const database = openDatabase(tempFile(), driver, 5000);
    return {
      store: sqliteStore({ database, table: 'keys_for_test', migrate: true }),
      cleanup: async () => void database.close(),
    };
  });
}

function input(overrides: Partial<ClaimInput> = {}): ClaimInput {
  return {
    scope: 'tenant',
    key: randomUUID(),
    fingerprint: 'fp',
    leaseMs: 30_000,
    retainMs: 60_000,
    ...overrides,
  };
}

const response: StoredResponse = { status: 201, headers: {}, body: new Uint8Array([1]) };

function notes(filename: string): string[] {
  return sqliteRows<{ text: string }>(filename, 'SELECT text FROM note ORDER BY rowid').map(
    (row) => row.text,
  );
}

describe.each(DRIVERS)('sqliteStore transactions (%s)', (driver) => {
  let filename: string;
  let store: SqliteStore;

  beforeAll(() => {
    filename = tempFile();
    store = sqliteStore({ url: filename, driver, migrate: true });
    store.database.exec('CREATE TABLE note (text TEXT NOT NULL)');
  });
  afterAll(() => store.close());

  it('a write of the store waits for an open transaction instead of joining it', async () => {
    const claimInput = input();
    const failure = new Error('application rolled back');
    const events: string[] = [];
    const transaction = store.transaction(async (db) => {
      db.prepare('INSERT INTO note (text) VALUES (?)').run('rolled back');
      await sleep(50);
      events.push('transaction ending');
      throw failure;
    });
    const claimed = store.claim(claimInput).then((result) => {
      events.push('claimed');
      return result;
    });
    await expect(transaction).rejects.toBe(failure);
    expect((await claimed).outcome).toBe('acquired');
    expect(events).toEqual(['transaction ending', 'claimed']);
    expect(notes(filename)).toEqual([]);
    const other = sqliteStore({ url: filename, driver, migrate: true });
    expect((await other.claim(claimInput)).outcome).toBe('in_progress');
    await other.close();
  });

  it('commits an async transaction and returns its value', async () => {
    const value = await store.transaction(async (db) => {
      db.prepare('INSERT INTO note (text) VALUES (?)').run('committed');
      await sleep(5);
      return 42;
    });
    expect(value).toBe(42);
    expect(notes(filename)).toEqual(['committed']);
    store.database.exec('DELETE FROM note');
  });

  it("inside atomic work, the store's own calls and transactions nest instead of deadlocking", async () => {
    const claimInput = input();
    const inner = input();
    const result = await store.atomic(claimInput, async (db) => {
      db.prepare('INSERT INTO note (text) VALUES (?)').run('outer');
      await expect(
        store.transaction(async (tx) => {
          tx.prepare('INSERT INTO note (text) VALUES (?)').run('inner, rolled back');
          throw new Error('inner failed');
        }),
      ).rejects.toThrow('inner failed');
      await store.transaction((tx) => tx.prepare('INSERT INTO note (text) VALUES (?)').run('inner, kept'));
      expect((await store.claim(inner)).outcome).toBe('acquired');
      return { response, commit: true };
    });
    expect(result).toMatchObject({ outcome: 'executed', committed: true });
    expect(notes(filename)).toEqual(['outer', 'inner, kept']);
    expect((await store.claim(inner)).outcome).toBe('in_progress');
    store.database.exec('DELETE FROM note');
  });

  it("a claim inside the application's own BEGIN is a savepoint of it and rolls back with it", async () => {
    const claimInput = input();
    store.database.exec('BEGIN');
    expect((await store.claim(claimInput)).outcome).toBe('acquired');
    store.database.prepare('INSERT INTO note (text) VALUES (?)').run('rolled back');
    store.database.exec('ROLLBACK');
    expect(notes(filename)).toEqual([]);
    expect((await store.claim(claimInput)).outcome).toBe('acquired');
  });

  it('rolls back a nested claim together with the atomic work', async () => {
    const claimInput = input();
    const inner = input();
    await store.atomic(claimInput, async () => {
      await store.claim(inner);
      return { response, commit: false };
    });
    expect((await store.claim(inner)).outcome).toBe('acquired');
  });

  // On Node 20 an AsyncLocalStorage in use runs async hooks for every promise and native handle of
  // the process, which every request of a service on this store then pays for.
  it('leaves no async hook running once its transactions have ended', async () => {
    const asyncIdInPromiseReaction = () => Promise.resolve().then(() => executionAsyncId());
    expect(await asyncIdInPromiseReaction()).toBe(0);
    await store.transaction(async (db) => {
      await store.transaction((tx) => tx.prepare('INSERT INTO note (text) VALUES (?)').run('nested'));
      db.prepare('DELETE FROM note').run();
    });
    await store.atomic(input(), async () => ({ response, commit: true }));
    await expect(store.transaction(() => Promise.reject(new Error('rolled back')))).rejects.toThrow();
    expect(await asyncIdInPromiseReaction()).toBe(0);
  });
});

describe('sqliteStore atomic request path', () => {
  it('a fresh key costs at most 9 statements and parses only its BEGIN', async () => {
    const statements: string[] = [];
    const database = new Database(tempFile(), { verbose: (sql) => statements.push(String(sql).trim()) });
    const store = sqliteStore({ database });
    await store.migrate();
    let parsed = 0;
    const exec = database.exec.bind(database);
    database.exec = (sql: string) => {
      parsed++;
      return exec(sql);
    };
    statements.length = 0;
    const result = await store.atomic(input(), async () => ({ response, commit: true }));
    expect(result).toMatchObject({ outcome: 'executed', committed: true });
    // A budget, not a script: today a settled read, BEGIN IMMEDIATE between two busy_timeout
    // PRAGMAs, the claim, a savepoint and its release around the work, the completion, COMMIT.
    expect(statements.length).toBeLessThanOrEqual(9);
    // SQLite applies busy_timeout when it prepares the PRAGMA, so the BEGIN's exec is parsed each time.
    expect(parsed).toBe(1);
    await store.close();
    database.close();
  });
});

describe('sqliteStore setup', () => {
  it.each(DRIVERS)(
    'opens its file in WAL with synchronous NORMAL on %s: no fsync per commit, as better-sqlite3 is built',
    async (driver) => {
      const store = sqliteStore({ url: tempFile(), driver, migrate: true });
      const pragma = (name: string) =>
        Object.values(store.database.prepare(`PRAGMA ${name}`).get() as object)[0];
      expect(pragma('journal_mode')).toBe('wal');
      expect(pragma('synchronous')).toBe(1);
      await store.close();
    },
  );

  it('opens its file in WAL mode with a table keyed by (scope, key) and an index on expires_at_ms', async () => {
    const store = sqliteStore({ url: tempFile(), driver: 'better-sqlite3' });
    await store.migrate();
    expect(store.database.pragma('journal_mode', { simple: true })).toBe('wal');
    const plan = store.database
      .prepare('EXPLAIN QUERY PLAN SELECT rowid FROM idempotency_keys WHERE expires_at_ms <= ? LIMIT ?')
      .all(Date.now(), 10)
      .map((row) => (row as { detail: string }).detail)
      .join('\n');
    expect(plan).toContain('idempotency_keys_expires_at_ms');
    const claimInput = input();
    expect((await store.claim(claimInput)).outcome).toBe('acquired');
    expect(() =>
      store.database
        .prepare(
          `INSERT INTO idempotency_keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
           VALUES (?, ?, 'x', 'x', 0, 0, 0)`,
        )
        .run(claimInput.scope, claimInput.key),
    ).toThrow(/UNIQUE/);
    await store.close();
  });

  it('creates no table at open: without `migrate` a call is a ConfigError naming the fix; store.migrate() makes it', async () => {
    const store = sqliteStore({ url: tempFile(), driver: 'better-sqlite3' });
    const tables = () => store.database.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all();
    expect(tables()).toEqual([]);
    await expect(store.claim(input())).rejects.toThrow(/does not exist.*store\.migrate\(\).*migrate: true/s);
    await expect(store.atomic(input(), async () => ({ response, commit: true }))).rejects.toThrow(
      /does not exist/,
    );
    await store.migrate();
    await store.migrate();
    expect((await store.claim(input())).outcome).toBe('acquired');
    await store.close();
    const onFirstUse = sqliteStore({ url: ':memory:', migrate: true });
    expect((await onFirstUse.atomic(input(), async () => ({ response, commit: true }))).outcome).toBe(
      'executed',
    );
    await onFirstUse.close();
  });

  it('closes a connection it opened and leaves a passed one open', async () => {
    const owned = sqliteStore({ url: tempFile(), driver: 'better-sqlite3', migrate: true });
    await owned.close();
    expect(owned.database.open).toBe(false);
    const database = new Database(tempFile());
    await sqliteStore({ database, migrate: true }).close();
    expect(database.open).toBe(true);
    database.close();
  });

  it('close() wakes pending waits', async () => {
    const store = sqliteStore({ url: tempFile(), migrate: true });
    const claimInput = input();
    await store.claim(claimInput);
    await expectWaitWokenBy(store, claimInput.scope, claimInput.key, () => store.close(), { settleMs: 20 });
  });

  it.each([
    [{}, /exactly one of `url` or `database`/],
    [{ url: 'a.db', database: {} as Database.Database }, /exactly one of/],
    [{ url: '' }, /`url` must be a non-empty string/],
    [{ database: {} as Database.Database }, /better-sqlite3 Database or a node:sqlite DatabaseSync/],
    [
      { url: ':memory:', driver: 'sqlite3' as SqliteDriverName },
      /`driver` must be 'better-sqlite3' or 'node:sqlite'/,
    ],
    [
      { database: new Database(':memory:'), driver: 'better-sqlite3' as const },
      /a `database` brings its own/,
    ],
    [{ url: ':memory:', table: 'keys; DROP TABLE loan' }, /`table` must match/],
    [{ url: ':memory:', busyTimeoutMs: 0 }, /busyTimeoutMs.*positive integer/],
    [{ url: ':memory:', pollIntervalMs: 1.5 }, /pollIntervalMs/],
    [{ url: ':memory:', pollIntervalMs: 100, maxPollIntervalMs: 50 }, /maxPollIntervalMs/],
  ])('rejects options %o', (options, message) => {
    expect(() => sqliteStore(options)).toThrow(message);
  });

  it.skipIf(nodeSqliteAvailable())(
    `on Node < ${NODE_SQLITE_MIN_VERSION}, driver node:sqlite is refused with the version it needs`,
    () => {
      expect(() => sqliteStore({ url: ':memory:', driver: 'node:sqlite', migrate: true })).toThrow(
        `node:sqlite needs Node ≥ ${NODE_SQLITE_MIN_VERSION}; this is Node ${process.versions.node}`,
      );
    },
  );

  it('names the driver it opened with; by default better-sqlite3 where it is installed', async () => {
    for (const driver of [undefined, ...DRIVERS]) {
      const store = sqliteStore({ url: ':memory:', driver, migrate: true });
      expect(store.driver).toBe(driver ?? 'better-sqlite3');
      await store.close();
    }
  });

  it('rejects a bad purge batch size', async () => {
    const store = sqliteStore({ url: ':memory:', migrate: true });
    await expect(store.purgeExpired(-1)).rejects.toThrow(/batchSize/);
    await store.close();
  });
});

const root = join(import.meta.dirname, '..');

interface ChildOutcome {
  outcome: string;
  body?: string;
}

/** Starts every child, lets them all go at once, and collects what each printed. */
async function race(filename: string, mode: 'claim' | 'atomic', processes: number, callsEach: number) {
  const fixture = join(root, 'test/fixtures/sqlite-claimer.mjs');
  const scope = `scope-${randomUUID()}`;
  const key = `key-${randomUUID()}`;
  const children = Array.from({ length: processes }, () => {
    const child = spawn(process.execPath, [fixture, filename, scope, key, mode, String(callsEach)], {
      cwd: root,
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    return { child, lines, exited };
  });
  for (const { lines } of children) expect((await lines.next()).value).toBe('ready');
  for (const { child } of children) child.stdin.write('go\n');
  const outcomes: ChildOutcome[] = [];
  for (const { lines, exited } of children) {
    const line = (await lines.next()).value as string;
    outcomes.push(...(JSON.parse(line) as ChildOutcome[]));
    expect(await exited).toBe(0);
  }
  return outcomes;
}

describe('sqliteStore across processes', () => {
  let filename: string;

  // The children import `retrysafe/sqlite` from dist/, which test/support/build.ts keeps fresh.
  beforeAll(async () => {
    filename = tempFile();
    const store = sqliteStore({ url: filename });
    await store.migrate();
    store.database.exec('CREATE TABLE effect (pid INTEGER NOT NULL)');
    await store.close();
  }, 120_000);

  it('wait sees a completion made through another connection', async () => {
    const owner = sqliteStore({ url: filename, migrate: true });
    const waiter = sqliteStore({ url: filename, migrate: true });
    const claimInput = input();
    const claimed = await owner.claim(claimInput);
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    await expectWaitWokenBy(waiter, claimInput.scope, claimInput.key, async () =>
      expect(await owner.complete(claimInput.scope, claimInput.key, claimed.token, response)).toBe(true),
    );
    expect((await waiter.claim(claimInput)).outcome).toBe('replay');
    await owner.close();
    await waiter.close();
  }, 15_000);

  // better-sqlite3's busy handler sleeps synchronously: one request waiting for the lock would
  // stall every other request of the process, reads included, and queue the next lock wait.
  it.each(DRIVERS)(
    "with %s, waiting for another process's write lock leaves the event loop free, within busyTimeoutMs",
    async (driver) => {
      const file = tempFile();
      const store = sqliteStore({ url: file, busyTimeoutMs: 1000, driver, migrate: true });
      const held = input();
      const claimed = await store.claim(held);
      if (claimed.outcome !== 'acquired') throw new Error(`expected acquired, got ${claimed.outcome}`);
      const { released } = await holdSqliteWriteLock(file, 2500);
      try {
        const events: string[] = [];
        const timer = sleep(50).then(() => events.push('timer'));
        const calls = [
          store.renew(held.scope, held.key, claimed.token, 30_000),
          store.claim(input()),
          store.atomic(input(), async () => ({ response, commit: true })),
          store.transaction(() => 'written'),
        ].map((call) =>
          call.then(
            () => events.push('answered'),
            (error: unknown) => events.push(isBusyError(error) ? 'busy' : String(error)),
          ),
        );
        await Promise.all([timer, ...calls]);
        expect(events).toEqual(['timer', 'busy', 'busy', 'busy', 'busy']);
      } finally {
        await released;
        await store.close();
      }
    },
    15_000,
  );

  it('of 4 processes × 20 concurrent claims of one key, exactly one acquires', async () => {
    const outcomes = await race(filename, 'claim', 4, 20);
    expect(outcomes).toHaveLength(80);
    expect(outcomes.filter((o) => o.outcome === 'acquired')).toHaveLength(1);
    expect(outcomes.filter((o) => o.outcome === 'in_progress')).toHaveLength(79);
  }, 60_000);

  it('of 4 processes × 5 concurrent atomic calls of one key, one executes once, the other processes replay it', async () => {
    const outcomes = await race(filename, 'atomic', 4, 5);
    expect(outcomes).toHaveLength(20);
    const executed = outcomes.filter((o) => o.outcome === 'executed');
    expect(executed).toHaveLength(1);
    // In each process the first call waits for the write lock, then executes or replays; the other
    // four are its in-process duplicates, which wait for it (not on the connection) and replay it.
    const replays = outcomes.filter((o) => o.outcome === 'replay');
    expect(replays).toHaveLength(19);
    for (const replay of replays) expect(replay.body).toBe(executed[0]!.body);
    const reader = new Database(filename, { readonly: true });
    expect(reader.prepare('SELECT count(*) AS n FROM effect').get()).toEqual({ n: 1 });
    reader.close();
  }, 60_000);
});

describe('sqliteStore clock', () => {
  it('stamps and judges records by `now`: moving it ages a key past retention', async () => {
    let offsetMs = 0;
    const store = sqliteStore({
      database: new Database(':memory:'),
      now: () => Date.now() + offsetMs,
      migrate: true,
    });
    const input: ClaimInput = {
      scope: 's',
      key: 'OD-old',
      fingerprint: 'fp',
      leaseMs: 30_000,
      retainMs: 86_400_000,
    };
    const claimed = await store.claim(input);
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    const response: StoredResponse = { status: 201, headers: {}, body: new Uint8Array([1]) };
    expect(await store.complete('s', 'OD-old', claimed.token, response)).toBe(true);
    expect((await store.claim(input)).outcome).toBe('replay');

    offsetMs = 30 * 86_400_000;
    const [record] = (await store.list()).records;
    expect(record).toBeUndefined();
    expect(await store.purgeExpired()).toBe(1);
    expect((await store.claim(input)).outcome).toBe('acquired');
    await store.close();
  });
});

/** Adds `live` completed records and `expired` ones whose retention has passed. */
function addRecords(db: Database.Database, live: number, expired: number) {
  const insert = db.prepare(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < @count)
    INSERT INTO idempotency_keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms,
      completed_at_ms, status, headers, body)
    SELECT '', lower(hex(randomblob(16))), 'fp', 'fill', @createdMs, @createdMs, @expiresMs, @createdMs, 201,
      '{}', randomblob(40) FROM g`);
  const nowMs = Date.now();
  insert.run({ count: live, createdMs: nowMs, expiresMs: nowMs + 86_400_000 });
  insert.run({ count: expired, createdMs: nowMs - 86_400_000, expiresMs: nowMs - 60_000 });
}

describe('sqliteStore purge of many records', () => {
  it('purges an in-memory database in batches too', async () => {
    const store = sqliteStore({ url: ':memory:', driver: 'better-sqlite3' });
    await store.migrate();
    addRecords(store.database, 10, 250);
    expect(await store.purgeExpired(100)).toBe(250);
    expect(await store.purgeExpired(100)).toBe(0);
    expect((await store.list()).records).toHaveLength(10);
    await store.close();
  });

  it.each([0, -1, 1.5, Number.NaN, '100'])('rejects batch size %o', async (batchSize) => {
    const store = sqliteStore({ url: ':memory:', migrate: true });
    await expect(store.purgeExpired(batchSize as number)).rejects.toThrow(/batchSize.*positive integer/);
    await store.close();
  });
});
