import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { IdempotencyStore } from '../src/core/contract/index.js';
import { idempotent } from '../src/core/index.js';
import { mysqlStore } from '../src/stores/mysql/index.js';
import { postgresStore } from '../src/stores/postgres/index.js';
import { redisStore } from '../src/stores/redis/index.js';
import { nodeSqliteAvailable } from '../src/stores/sqlite/driver.js';
import { sqliteStore } from '../src/stores/sqlite/index.js';
import { hasPgBouncer, type PgBouncer, startPgBouncer } from './support/pgbouncer.js';
import {
  clusterClient,
  deleteClusterKeys,
  hasRedisCluster,
  REDIS_CLUSTER_NODES,
} from './support/redis-cluster.js';
import {
  deleteRedisKeys,
  hasMysql,
  hasPostgres,
  hasRedis,
  mysqlDatabase,
  PG_URL,
  REDIS_URL,
  uniqueName,
} from './support/services.js';
import { sqliteRows } from './support/sqlite-rows.js';

const CLI = new URL('../dist/cli.js', import.meta.url).pathname;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a built CLI as a user would, in `cwd`; a run that hangs is killed and fails the test. */
function runCli(path: string, args: string[], cwd?: string, env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [path, ...args],
      { timeout: 20_000, cwd, env: { ...process.env, DATABASE_URL: '', ...env } },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

const cli = (...args: string[]) => runCli(CLI, args);

/** Rows for the records table, `expired` of them past their retention, `live` not. */
function rows(expired: number, live: number) {
  const now = Date.now();
  return [
    ...Array.from({ length: expired }, (_, i) => [`old-${i}`, now - 120_000, now - 60_000]),
    ...Array.from({ length: live }, (_, i) => [`new-${i}`, now + 60_000, now + 600_000]),
  ] as [string, number, number][];
}

beforeAll(() => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first (npm test does)`);
});

describe('retrysafe CLI', () => {
  it('prints usage and exits 2 on a bad command line', async () => {
    for (const args of [
      [],
      ['frobnicate'],
      ['migrate'],
      ['purge', '--database-url', 'x.db', '--batch-size', '0'],
    ]) {
      const run = await cli(...args);
      expect(run.code).toBe(2);
      expect(run.stderr).toContain('Usage:');
    }
    const help = await cli('--help');
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('retrysafe migrate --database-url');
  });

  it('--version prints the package version', async () => {
    const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
    expect(await cli('--version')).toMatchObject({ code: 0, stdout: `${version}\n`, stderr: '' });
  });

  it('refuses a --database-url that is neither a postgres:// URL nor a SQLite file, creating nothing', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-cli-url-'));
    try {
      for (const url of ['postgres@127.0.0.1:5432', 'postgress://root@127.0.0.1/test', 'keys']) {
        for (const command of [['migrate'], ['purge'], ['keys', 'list']]) {
          const run = await runCli(CLI, [...command, '--database-url', url], dir);
          expect(run.code).toBe(2);
          expect(run.stderr).toContain(`--database-url ${JSON.stringify(url)} is neither`);
        }
      }
      expect(readdirSync(dir)).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a missing driver says which package to install', async () => {
    // A copy of the package whose node_modules holds everything but the driver under test.
    const project = mkdtempSync(join(tmpdir(), 'retrysafe-cli-driver-'));
    try {
      cpSync(new URL('../dist', import.meta.url), join(project, 'dist'), { recursive: true });
      cpSync(new URL('../package.json', import.meta.url), join(project, 'package.json'));
      const modules = new URL('../node_modules/', import.meta.url).pathname;
      for (const [driver, args] of [
        ['pg', ['keys', 'list', '--database-url', 'postgres://root@127.0.0.1:1/test']],
        ['ioredis', ['keys', 'list', '--redis-url', 'redis://127.0.0.1:1']],
      ] as const) {
        rmSync(join(project, 'node_modules'), { recursive: true, force: true });
        mkdirSync(join(project, 'node_modules'));
        for (const name of readdirSync(modules).filter((name) => name !== driver)) {
          symlinkSync(join(modules, name), join(project, 'node_modules', name));
        }
        const run = await runCli(join(project, 'dist/cli.js'), [...args]);
        expect(run.code).toBe(1);
        expect(run.stderr).toContain(`needs the ${driver} package: npm install ${driver}`);
      }
    } finally {
      rmSync(project, { recursive: true, force: true });
    }
  });

  // Hiding better-sqlite3 needs module.registerHooks, as node:sqlite's store needs Node 22.16.
  it.skipIf(!nodeSqliteAvailable())(
    'without better-sqlite3, the SQLite commands run on node:sqlite',
    async () => {
      const file = join(mkdtempSync(join(tmpdir(), 'retrysafe-cli-nodesqlite-')), 'keys.db');
      const hidden = {
        NODE_OPTIONS: `--import=${new URL('./support/without-better-sqlite3.mjs', import.meta.url).href}`,
      };
      const migrated = await runCli(CLI, ['migrate', '--database-url', file], undefined, hidden);
      expect(migrated.code).toBe(0);
      const listed = await runCli(CLI, ['keys', 'list', '--database-url', file], undefined, hidden);
      expect(listed.code).toBe(0);
    },
  );

  it('exits 1 with the error when the database is unreachable', async () => {
    const run = await cli('migrate', '--database-url', 'postgres://postgres@127.0.0.1:1/test');
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/ECONNREFUSED/);
  });

  describe('on SQLite', () => {
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-cli-'));
    const file = join(dir, 'keys.db');
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it('purge on a path with no database exits 2 naming it, and creates nothing', async () => {
      const mistyped = join(dir, 'kyes.db');
      const run = await cli('purge', '--database-url', mistyped);
      expect(run.code).toBe(2);
      expect(run.stderr).toContain(mistyped);
      expect(existsSync(mistyped)).toBe(false);
    });

    it('keys and purge refuse a table that does not exist, naming it, and create none', async () => {
      const path = join(dir, 'existing.db');
      new Database(path).close();
      for (const command of [['keys', 'list'], ['keys', 'show', 'k'], ['keys', 'delete', 'k'], ['purge']]) {
        const run = await cli(...command, '--database-url', path, '--table', 'nope');
        expect(run.code).toBe(2);
        expect(run.stderr).toContain('no table "nope"');
      }
      expect(sqliteRows(path, 'SELECT name FROM sqlite_master')).toEqual([]);
    });

    it('migrate --print prints the SQL and touches no database', async () => {
      const path = join(dir, 'not-created.db');
      const run = await cli('migrate', '--print', '--database-url', path, '--table', 'keys');
      expect(run).toMatchObject({ code: 0, stderr: '' });
      expect(existsSync(path)).toBe(false);
      const db = new Database(':memory:');
      try {
        db.exec(run.stdout);
        expect(
          db.prepare("SELECT name FROM sqlite_master WHERE tbl_name = 'keys' ORDER BY 1").pluck().all(),
        ).toEqual(['keys', 'keys_abandoned', 'keys_expires_at_ms', 'sqlite_autoindex_keys_1']);
      } finally {
        db.close();
      }
      expect((await cli('purge', '--print', '--database-url', path)).code).toBe(2);
    });

    it('migrate creates the table; purge deletes only expired records and prints the count', async () => {
      expect((await cli('migrate', '--database-url', file, '--table', 'keys')).code).toBe(0);
      const db = new Database(file);
      try {
        const insert = db.prepare(
          `INSERT INTO keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
           VALUES ('s', ?, 'f', 't', ?, 0, ?)`,
        );
        for (const row of rows(5, 2)) insert.run(...row);
        const run = await cli('purge', '--database-url', file, '--table', 'keys', '--batch-size', '2');
        expect(run).toMatchObject({ code: 0, stderr: '' });
        expect(run.stdout).toMatch(/^purged 5 expired records/);
        expect(db.prepare('SELECT key FROM keys ORDER BY key').pluck().all()).toEqual(['new-0', 'new-1']);
      } finally {
        db.close();
      }
    });
  });

  describe.skipIf(!hasPostgres)('on PostgreSQL', () => {
    const schema = uniqueName('rs_cli');
    const admin = new pg.Client({ connectionString: PG_URL });
    beforeAll(() => admin.connect());
    afterAll(async () => {
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await admin.end();
    });

    it('migrate creates schema, table and index, and can run again', async () => {
      for (let round = 0; round < 2; round++) {
        const run = await cli('migrate', '--database-url', PG_URL, '--schema', schema, '--table', 'keys');
        expect(run).toMatchObject({ code: 0, stderr: '' });
        expect(run.stdout).toContain(`migrated "${schema}"."keys"`);
      }
      const { rows: indexes } = await admin.query(
        'SELECT indexname FROM pg_indexes WHERE schemaname = $1 ORDER BY 1',
        [schema],
      );
      expect(indexes.map((r) => r.indexname)).toEqual(['keys_abandoned', 'keys_expires_at_ms', 'keys_pkey']);
    });

    it('keys and purge refuse a schema or table that does not exist, and create none', async () => {
      const missing = `${schema}_nope`;
      for (const [option, name, label] of [
        ['--schema', missing, `"${missing}"."idempotency_keys"`],
        ['--table', 'nope', '"public"."nope"'],
      ] as const) {
        for (const command of [['keys', 'list'], ['keys', 'show', 'k'], ['keys', 'delete', 'k'], ['purge']]) {
          const run = await cli(...command, '--database-url', PG_URL, option, name);
          expect(run.code).toBe(2);
          expect(run.stderr).toContain(`no table ${label}`);
        }
      }
      const { rows: made } = await admin.query(
        "SELECT 1 FROM pg_namespace WHERE nspname = $1 UNION ALL SELECT 1 FROM pg_tables WHERE schemaname = 'public' AND tablename = 'nope'",
        [missing],
      );
      expect(made).toEqual([]);
    });

    it('migrate --print prints SQL that makes a working table, without connecting', async () => {
      const own = `${schema}_print`;
      // Port 1: a connection attempt would fail the run.
      const run = await cli(
        'migrate',
        '--print',
        '--database-url',
        'postgres://postgres@127.0.0.1:1/test',
        '--schema',
        own,
      );
      expect(run).toMatchObject({ code: 0, stderr: '' });
      expect(run.stdout).toContain(`CREATE TABLE IF NOT EXISTS "${own}"."idempotency_keys"`);
      const store = postgresStore({ url: PG_URL, schema: own });
      try {
        await admin.query(run.stdout);
        const input = { scope: 's', key: 'k', fingerprint: 'f', leaseMs: 1000, retainMs: 1000 };
        expect((await store.claim(input)).outcome).toBe('acquired');
      } finally {
        await store.close();
        await admin.query(`DROP SCHEMA IF EXISTS "${own}" CASCADE`);
      }
    });

    it('purge deletes only expired records and prints the count', async () => {
      for (const [key, leaseUntilMs, expiresAtMs] of rows(7, 3)) {
        await admin.query(
          `INSERT INTO "${schema}".keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
           VALUES ('s', $1, 'f', 't', $2, 0, $3)`,
          [key, leaseUntilMs, expiresAtMs],
        );
      }
      const run = await cli(
        'purge',
        '--database-url',
        PG_URL,
        '--schema',
        schema,
        '--table',
        'keys',
        '--batch-size',
        '3',
      );
      expect(run).toMatchObject({ code: 0, stderr: '' });
      expect(run.stdout).toMatch(/^purged 7 expired records/);
      const { rows: left } = await admin.query(`SELECT key FROM "${schema}".keys ORDER BY key`);
      expect(left.map((r) => r.key)).toEqual(['new-0', 'new-1', 'new-2']);
    });
  });

  it.skipIf(!(hasPostgres && hasPgBouncer))(
    'behind PgBouncer (transaction pooling) migrate refuses without --pooling transaction, naming it, and works with it',
    async () => {
      const schema = uniqueName('rs_cli_pgb');
      const bouncer = await startPgBouncer();
      const pooled = ['--database-url', bouncer.url, '--schema', schema];
      try {
        const refused = await cli('migrate', ...pooled);
        expect(refused.code).toBe(2);
        expect(refused.stderr).toContain('as PgBouncer in transaction mode does: add --pooling transaction');
        for (let round = 0; round < 2; round++) {
          const run = await cli('migrate', ...pooled, '--pooling', 'transaction');
          expect(run).toMatchObject({ code: 0, stderr: '' });
          expect(run.stdout).toContain(`migrated "${schema}"."idempotency_keys"`);
        }
        const purge = await cli('purge', ...pooled, '--pooling', 'transaction');
        expect(purge).toMatchObject({ code: 0, stderr: '' });
        expect(purge.stdout).toMatch(/^purged 0 expired records/);
      } finally {
        await bouncer.stop();
        const admin = new pg.Client({ connectionString: PG_URL });
        await admin.connect();
        await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
        await admin.end();
      }
    },
  );

  it('refuses a --pooling other than session or transaction, and --pooling on another store', async () => {
    const bad = await cli('migrate', '--database-url', PG_URL, '--pooling', 'statement');
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--pooling must be session or transaction');
    const elsewhere = await cli('keys', 'list', '--redis-url', REDIS_URL, '--pooling', 'transaction');
    expect(elsewhere.code).toBe(2);
    expect(elsewhere.stderr).toContain('--pooling applies to PostgreSQL only');
  });

  describe.skipIf(!hasMysql)('on MySQL (MariaDB)', () => {
    it('migrate creates the table, can run again, and keys and purge then work on it', async () => {
      const database = await mysqlDatabase();
      const store = mysqlStore({ url: database.url, table: 'keys' });
      try {
        for (const command of [['keys', 'list'], ['purge']]) {
          const run = await cli(...command, '--database-url', database.url, '--table', 'keys');
          expect(run.code).toBe(2);
          expect(run.stderr).toContain(`no table \`keys\` in ${database.name}`);
        }
        for (let round = 0; round < 2; round++) {
          const run = await cli('migrate', '--database-url', database.url, '--table', 'keys');
          expect(run).toMatchObject({ code: 0, stderr: '' });
          expect(run.stdout).toContain(`migrated \`keys\` in ${database.name}`);
        }
        await store.claim({ scope: 's', key: 'old', fingerprint: 'f', leaseMs: 1, retainMs: 1 });
        await store.claim({ scope: 's', key: 'new', fingerprint: 'f', leaseMs: 60_000, retainMs: 60_000 });
        await new Promise((resolve) => setTimeout(resolve, 50));
        const run = await cli('purge', '--database-url', database.url, '--table', 'keys');
        expect(run).toMatchObject({ code: 0, stderr: '' });
        expect(run.stdout).toMatch(/^purged 1 expired record/);
        expect((await store.list()).records.map((r) => r.key)).toEqual(['new']);
      } finally {
        await store.close();
        await database.drop();
      }
    });

    it('migrate --print prints the SQL without connecting', async () => {
      // Port 1: a connection attempt would fail the run.
      const run = await cli('migrate', '--print', '--database-url', 'mysql://root@127.0.0.1:1/x');
      expect(run).toMatchObject({ code: 0, stderr: '' });
      expect(run.stdout).toContain('CREATE TABLE IF NOT EXISTS `idempotency_keys`');
    });
  });
});

/**
 * Seeds a store with one completed and one in-progress record (two finished steps) in scope
 * `tenant`, one in `other`.
 */
async function seed(store: IdempotencyStore): Promise<void> {
  const claim = (scope: string, key: string) =>
    store.claim({ scope, key, fingerprint: 'f', leaseMs: 60_000, retainMs: 600_000 });
  const done = await claim('tenant', 'order-1');
  if (done.outcome !== 'acquired') throw new Error(done.outcome);
  await store.complete('tenant', 'order-1', done.token, {
    status: 201,
    headers: {},
    body: new TextEncoder().encode('secret body'),
  });
  const running = await claim('tenant', 'order-2');
  if (running.outcome !== 'acquired') throw new Error(running.outcome);
  for (const name of ['recorded', 'charged']) {
    await store.saveStep(
      'tenant',
      'order-2',
      running.token,
      { name, value: '"secret step"' },
      'secret request',
    );
  }
  await claim('other', 'order-1');
}

/** The keys commands on one store, given the arguments that name it. */
function describeKeysCommands(
  open: () => Promise<{ args: string[]; store: IdempotencyStore; cleanup: () => Promise<void> }>,
  // Redis lists in SCAN order (docs/reference.md), which puts records of one page in any order
  // once the server holds other keys; the SQL stores list by (scope, key).
  order: 'by key' | 'scan' = 'by key',
) {
  let args: string[];
  let store: IdempotencyStore;
  let cleanup: (() => Promise<void>) | undefined;
  const listed = <T>(records: T[]) => (order === 'scan' ? [...records].sort() : records);
  beforeAll(async () => {
    ({ args, store, cleanup } = await open());
    await seed(store);
  });
  afterAll(async () => {
    await store?.close();
    await cleanup?.();
  });

  it('keys list prints a table of the live records, --json the records', async () => {
    const run = await cli('keys', 'list', ...args);
    expect(run).toMatchObject({ code: 0, stderr: '' });
    const lines = run.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^SCOPE\s+KEY\s+STATE\s+STATUS\s+CREATED\s+EXPIRES\s+LEASE UNTIL$/);
    expect(listed(lines.slice(1).map((line) => line.split(/\s+/).slice(0, 4)))).toEqual([
      ['other', 'order-1', 'in_progress', '-'],
      ['tenant', 'order-1', 'completed', '201'],
      ['tenant', 'order-2', 'in_progress', '-'],
    ]);
    expect(run.stdout).not.toContain('secret body');
    const json = await cli('keys', 'list', ...args, '--scope', 'tenant', '--json');
    expect(json.code).toBe(0);
    const records = JSON.parse(json.stdout).records as { key: string; state: string }[];
    expect(listed(records.map((r) => [r.key, r.state]))).toEqual([
      ['order-1', 'completed'],
      ['order-2', 'in_progress'],
    ]);
  });

  it('keys list --limit pages, printing how to ask for the next page', async () => {
    const first = await cli('keys', 'list', ...args, '--limit', '2', '--json');
    const page = JSON.parse(first.stdout) as { records: { key: string }[]; next: string | null };
    const seen = [...page.records];
    let next = page.next;
    for (let round = 0; next !== null && round < 10; round++) {
      const more = JSON.parse(
        (await cli('keys', 'list', ...args, '--limit', '2', '--after', next, '--json')).stdout,
      );
      seen.push(...more.records);
      next = more.next;
    }
    expect(seen.map((r) => r.key).sort()).toEqual(['order-1', 'order-1', 'order-2']);
    const table = await cli('keys', 'list', ...args, '--limit', '1');
    expect(table.stdout).toMatch(/--after \S+/);
  });

  it('keys show prints one record; a missing one exits 1', async () => {
    const run = await cli('keys', 'show', 'order-1', '--scope', 'tenant', ...args, '--json');
    expect(run.code).toBe(0);
    expect(JSON.parse(run.stdout)).toMatchObject({
      scope: 'tenant',
      key: 'order-1',
      state: 'completed',
      status: 201,
    });
    const table = await cli('keys', 'show', 'order-1', '--scope', 'tenant', ...args);
    expect(table.stdout).toMatch(/^state\s+completed$/m);
    const missing = await cli('keys', 'show', 'order-9', '--scope', 'tenant', ...args);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain('"order-9" in scope "tenant"');
    // Finished steps by name; never their results or the saved request.
    const running = await cli('keys', 'show', 'order-2', '--scope', 'tenant', ...args);
    expect(running.stdout).toMatch(/^steps\s+recorded, charged$/m);
    expect(running.stdout).not.toContain('secret');
    const runningJson = JSON.parse(
      (await cli('keys', 'show', 'order-2', '--scope', 'tenant', ...args, '--json')).stdout,
    );
    expect(runningJson.steps).toEqual(['recorded', 'charged']);
    expect(table.stdout).toMatch(/^steps\s+-$/m);
    // The default scope is "", where a service's keys rarely are: say so, and how to find them.
    const unscoped = await cli('keys', 'show', 'order-1', ...args);
    expect(unscoped.code).toBe(1);
    expect(unscoped.stderr).toContain('"order-1" in scope "" (the default scope)');
    expect(unscoped.stderr).toContain('--scope');
    expect(unscoped.stderr).toContain('retrysafe keys list');
  });

  it('keys show --response prints the saved answer, as text or JSON; an encrypted body opens with IDEMPOTENCY_ENCRYPTION_KEY', async () => {
    const text = await cli('keys', 'show', 'order-1', '--scope', 'tenant', ...args, '--response');
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^201 Created\n\nsecret body$/m);
    const json = await cli('keys', 'show', 'order-1', '--scope', 'tenant', ...args, '--response', '--json');
    expect(JSON.parse(json.stdout)).toMatchObject({
      state: 'completed',
      response: { status: 201, headers: {}, body: 'secret body' },
    });
    const running = await cli('keys', 'show', 'order-2', '--scope', 'tenant', ...args, '--response');
    expect(running.stdout).toContain('no saved answer: the record is in progress');
    // Without --response the answer stays out, as before.
    expect((await cli('keys', 'show', 'order-1', '--scope', 'tenant', ...args)).stdout).not.toContain(
      'secret body',
    );

    // A record saved by an engine with encryptionKey: sealed at rest, opened with the key.
    const keyRing = [randomBytes(32).toString('base64'), randomBytes(32).toString('base64')];
    const sealing = idempotent<string>({
      store,
      scope: 'sealed',
      encryptionKey: keyRing[1]!,
      key: (input) => input,
    });
    await sealing('order-s', async () => ({ note: 'sealed body' }));
    const sealed = await cli('keys', 'show', 'order-s', '--scope', 'sealed', ...args, '--response', '--json');
    expect(sealed.stdout).not.toContain('sealed body');
    expect(JSON.parse(sealed.stdout).response.bodyBase64).toEqual(expect.any(String));
    const opened = await runCli(
      CLI,
      ['keys', 'show', 'order-s', '--scope', 'sealed', ...args, '--response'],
      undefined,
      { IDEMPOTENCY_ENCRYPTION_KEY: keyRing.join(',') },
    );
    expect(opened.stdout).toContain('sealed body');
    const wrongKey = await runCli(
      CLI,
      ['keys', 'show', 'order-s', '--scope', 'sealed', ...args, '--response'],
      undefined,
      { IDEMPOTENCY_ENCRYPTION_KEY: keyRing[0]! },
    );
    expect(wrongKey.stdout).toContain('cannot be decrypted');
    expect(await store.delete('sealed', 'order-s')).toBe(true);
  });

  it('--response applies to keys show only', async () => {
    const run = await cli('keys', 'list', ...args, '--response');
    expect(run.code).not.toBe(0);
    expect(run.stderr).toContain('--response applies to keys show only');
  });

  it('keys delete frees one key in one scope', async () => {
    const run = await cli('keys', 'delete', 'order-2', '--scope', 'tenant', ...args);
    expect(run).toMatchObject({ code: 0, stderr: '' });
    expect(await store.get('tenant', 'order-2')).toBeUndefined();
    expect(await store.get('tenant', 'order-1')).toBeDefined();
    const again = await cli('keys', 'delete', 'order-2', '--scope', 'tenant', ...args);
    expect(again.code).toBe(1);
    const claimed = await store.claim({
      scope: 'tenant',
      key: 'order-2',
      fingerprint: 'g',
      leaseMs: 1000,
      retainMs: 1000,
    });
    expect(claimed.outcome).toBe('acquired');
  });
}

describe('retrysafe keys', () => {
  it('refuses a command line naming no store, or two', async () => {
    for (const extra of [[], ['--database-url', 'x.db', '--redis-url', REDIS_URL]]) {
      const run = await cli('keys', 'list', ...extra);
      expect(run.code).toBe(2);
      expect(run.stderr).toContain('Usage:');
    }
    expect((await cli('keys', 'show', '--database-url', 'x.db')).code).toBe(2);
  });

  it.skipIf(!hasRedis)('uses the Redis database the URL names, and fails on one Redis refuses', async () => {
    const prefix = `${uniqueName('rs_cli_db')}:`;
    const store = redisStore({ url: `${REDIS_URL}/3`, prefix });
    try {
      const claimed = await store.claim({
        scope: '',
        key: 'in-db-3',
        fingerprint: 'f',
        leaseMs: 60_000,
        retainMs: 60_000,
      });
      expect(claimed.outcome).toBe('acquired');
      const listed = await cli('keys', 'list', '--redis-url', `${REDIS_URL}/3`, '--prefix', prefix);
      expect(listed.code).toBe(0);
      expect(listed.stdout).toContain('in-db-3');
      const other = await cli('keys', 'list', '--redis-url', `${REDIS_URL}/0`, '--prefix', prefix);
      expect(other.stdout).not.toContain('in-db-3');
      const refused = await cli('keys', 'list', '--redis-url', `${REDIS_URL}/99`, '--prefix', prefix);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toContain('refuses the database 99');
    } finally {
      await store.delete('', 'in-db-3');
      await store.close();
    }
  });

  it('refuses --schema or --table with a Redis URL', async () => {
    for (const option of ['--schema', '--table']) {
      const run = await cli('keys', 'list', '--redis-url', REDIS_URL, option, 'x');
      expect(run.code).toBe(2);
      expect(run.stderr).toContain(`${option} applies to`);
    }
  });

  describe('on SQLite', () => {
    describeKeysCommands(async () => {
      const dir = mkdtempSync(join(tmpdir(), 'retrysafe-cli-keys-'));
      const file = join(dir, 'keys.db');
      return {
        args: ['--database-url', file],
        store: sqliteStore({ url: file, migrate: true }),
        cleanup: async () => rmSync(dir, { recursive: true, force: true }),
      };
    });

    it("lists, shows and deletes idempotent()'s records as it does HTTP ones", async () => {
      const dir = mkdtempSync(join(tmpdir(), 'retrysafe-cli-jobs-'));
      const file = join(dir, 'jobs.db');
      const store = sqliteStore({ url: file, migrate: true });
      try {
        let runs = 0;
        const run = idempotent({ store, scope: 'receipts', key: (job: { id: string }) => job.id });
        const send = () => run({ id: 'loan-7' }, () => ({ receipt: ++runs }));
        await send();
        const list = await cli('keys', 'list', '--database-url', file, '--scope', 'receipts');
        expect(list.stdout.trim().split('\n')[1]?.split(/\s+/).slice(0, 4)).toEqual([
          'receipts',
          'loan-7',
          'completed',
          '200',
        ]);
        const show = await cli(
          'keys',
          'show',
          'loan-7',
          '--scope',
          'receipts',
          '--database-url',
          file,
          '--json',
        );
        expect(JSON.parse(show.stdout)).toMatchObject({
          scope: 'receipts',
          key: 'loan-7',
          state: 'completed',
        });
        expect(await send()).toEqual({ receipt: 1 });
        const deleted = await cli('keys', 'delete', 'loan-7', '--scope', 'receipts', '--database-url', file);
        expect(deleted.code).toBe(0);
        // Deleted, the key names a new operation: the next delivery runs the work again.
        expect(await send()).toEqual({ receipt: 2 });
      } finally {
        await store.close();
        rmSync(dir, { recursive: true, force: true });
      }
    });
    it('keys list keeps a long scope or key to a readable column; --json gives it whole', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'retrysafe-cli-long-'));
      const file = join(dir, 'long.db');
      const store = sqliteStore({ url: file, migrate: true });
      const key = `order-${'k'.repeat(240)}-end`;
      try {
        for (const [scope, k] of [
          ['tenant', key],
          ['s'.repeat(200), 'short'],
        ]) {
          await store.claim({ scope: scope!, key: k!, fingerprint: 'f', leaseMs: 60_000, retainMs: 60_000 });
        }
        const list = await cli('keys', 'list', '--database-url', file);
        expect(list.code).toBe(0);
        const widths = list.stdout
          .trimEnd()
          .split('\n')
          .map((line) => line.length);
        expect(Math.max(...widths)).toBeLessThanOrEqual(200);
        // Both ends of a cut key stay: keys tend to differ at the end (a counter, a UUID).
        expect(list.stdout).toMatch(/order-k+…k+-end/);
        const json = await cli('keys', 'list', '--database-url', file, '--json');
        expect((JSON.parse(json.stdout).records as { key: string }[]).map((r) => r.key)).toContain(key);
      } finally {
        await store.close();
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });

  describe.skipIf(!hasPostgres)('on PostgreSQL', () => {
    describeKeysCommands(async () => {
      const schema = uniqueName('rs_cli_keys');
      return {
        args: ['--database-url', PG_URL, '--schema', schema],
        store: postgresStore({ url: PG_URL, schema, migrate: true }),
        async cleanup() {
          const admin = new pg.Client({ connectionString: PG_URL });
          await admin.connect();
          await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
          await admin.end();
        },
      };
    });
  });

  describe.skipIf(!(hasPostgres && hasPgBouncer))(
    'on PostgreSQL behind PgBouncer (--pooling transaction)',
    () => {
      let bouncer: PgBouncer;
      describeKeysCommands(async () => {
        bouncer = await startPgBouncer();
        const schema = uniqueName('rs_cli_keys_pgb');
        return {
          args: ['--database-url', bouncer.url, '--schema', schema, '--pooling', 'transaction'],
          store: postgresStore({ url: PG_URL, schema, migrate: true }),
          async cleanup() {
            await bouncer.stop();
            const admin = new pg.Client({ connectionString: PG_URL });
            await admin.connect();
            await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
            await admin.end();
          },
        };
      });
    },
  );

  describe.skipIf(!hasMysql)('on MySQL (MariaDB)', () => {
    describeKeysCommands(async () => {
      const database = await mysqlDatabase();
      return {
        args: ['--database-url', database.url],
        store: mysqlStore({ url: database.url, migrate: true }),
        cleanup: database.drop,
      };
    });
  });

  describe.skipIf(!hasRedis)('on Redis', () => {
    describeKeysCommands(async () => {
      const prefix = `${uniqueName('rs_cli_keys')}:`;
      return {
        args: ['--redis-url', REDIS_URL, '--prefix', prefix],
        store: redisStore({ url: REDIS_URL, prefix }),
        cleanup: () => deleteRedisKeys(prefix),
      };
    }, 'scan');
  });

  // Keys on every master: list walks them all.
  describe.skipIf(!hasRedisCluster)('on Redis Cluster', () => {
    describeKeysCommands(async () => {
      const prefix = `${uniqueName('rs_cli_cluster')}:`;
      return {
        args: ['--redis-cluster', REDIS_CLUSTER_NODES.slice(0, 2).join(','), '--prefix', prefix],
        store: redisStore({ clusterNodes: REDIS_CLUSTER_NODES, prefix }),
        async cleanup() {
          const admin = clusterClient();
          await deleteClusterKeys(admin, prefix);
          await admin.quit();
        },
      };
    }, 'scan');
  });
});
