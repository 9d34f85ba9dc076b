import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore } from '../src/stores/postgres.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';

const CLI = new URL('../dist/cli.js', import.meta.url).pathname;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the built CLI as a user would; a run that hangs is killed and fails the test. */
function cli(...args: string[]): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [CLI, ...args],
      { timeout: 20_000, env: { ...process.env, DATABASE_URL: '' } },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

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

  it('exits 1 with the error when the database is unreachable', async () => {
    const run = await cli('migrate', '--database-url', 'postgres://postgres@127.0.0.1:1/test');
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/ECONNREFUSED/);
  });

  describe('on SQLite', () => {
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-cli-'));
    const file = join(dir, 'keys.db');
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it('purge on a path with no database exits 1 naming it, and creates nothing', async () => {
      const mistyped = join(dir, 'kyes.db');
      const run = await cli('purge', '--database-url', mistyped);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(mistyped);
      expect(existsSync(mistyped)).toBe(false);
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
        ).toEqual(['keys', 'keys_expires_at_ms', 'sqlite_autoindex_keys_1']);
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
      expect(indexes.map((r) => r.indexname)).toEqual(['keys_expires_at_ms', 'keys_pkey']);
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
      const store = postgresStore({ connectionString: PG_URL, schema: own });
      try {
        await admin.query(run.stdout);
        const input = { scope: 's', key: 'k', fingerprint: 'f', leaseMs: 1000, ttlMs: 1000 };
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
});
