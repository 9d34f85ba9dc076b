import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { dropSchemas, hasPostgres, hasRedis, PG_URL, REDIS_URL, uniqueName } from './support/services.js';
import { sqliteRows } from './support/sqlite-rows.js';

// A payment in three steps, its process SIGKILLed at each step boundary (and inside a step, before
// its save), then the same request sent again after the lease (or a completer run instead): one
// fine, one charge at a provider that honours the step's key, paid, and every retry answered alike.

const WORKER = join(import.meta.dirname, 'fixtures', 'steps-worker.mjs');
const dir = mkdtempSync(join(tmpdir(), 'retrysafe-steps-crash-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Run {
  signal: NodeJS.Signals | null;
  answer?: { kind: string; body?: string };
}

function worker(args: string[]): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [WORKER, ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (chunk) => (out += chunk));
    child.on('error', reject);
    child.on('close', (code, signal) => {
      if (signal === null && code !== 0) return reject(new Error(`worker exited with ${code}`));
      resolve({ signal, answer: out.trim() ? JSON.parse(out.trim()) : undefined });
    });
  });
}

type Kind = 'sqlite' | 'postgres' | 'redis';

interface Setup {
  target: string;
  /** The fines of `key`, with their status, wherever the fine table lives for this store. */
  fines(key: string, providerFile: string): Promise<string[]>;
}

async function crashThenRetry(kind: Kind, setup: Setup, crash: string, finish: 'retry' | 'complete') {
  const key = randomUUID();
  const providerFile = join(dir, `provider-${key}.db`);
  const run = (point: string, mode = 'request') =>
    worker([kind, setup.target, key, point, mode, providerFile, kind === 'redis' ? REDIS_URL : PG_URL]);
  expect((await run(crash)).signal).toBe('SIGKILL');
  const finished = await run('none', finish === 'complete' ? 'complete' : 'request');
  expect(finished.answer?.kind).toBe('executed');
  const retry = await run('none');
  expect(retry.answer?.kind).toBe('replayed');
  expect(retry.answer?.body).toBe(finished.answer?.body);
  expect(JSON.parse(retry.answer!.body!)).toMatchObject({ status: 'paid' });
  const provider = new Database(providerFile, { readonly: true });
  const count = (table: string) =>
    (provider.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;
  const result = {
    charges: count('charge'),
    attempts: count('attempt'),
    fines: await setup.fines(key, providerFile),
  };
  provider.close();
  return result;
}

// 'inside-recorded' dies inside a phase, after its INSERT and before its commit: one fine proves
// the phase's writes went with its unsaved result.
const SQL_CRASHES = ['inside-recorded', 'recorded', 'charged', 'paid', 'inside-charged'];

/** The statuses of the fines of `key` in the SQLite file `filename`. */
const fineStatuses = (filename: string, key: string) =>
  sqliteRows<{ status: string }>(filename, 'SELECT status FROM fine WHERE key = ?', key).map(
    (row) => row.status,
  );

function describeCrashes(
  kind: Kind,
  crashes: string[],
  setup: () => Promise<Setup>,
  cleanup: () => Promise<void>,
) {
  describe(`steps on ${kind}: SIGKILL at each step boundary`, () => {
    let ready: Setup;
    afterAll(cleanup);
    it.each(crashes)('killed at %s: one fine, paid; one charge; the retry answers alike', async (crash) => {
      ready ??= await setup();
      const result = await crashThenRetry(kind, ready, crash, 'retry');
      expect(result.fines).toEqual(['paid']);
      expect(result.charges).toBe(1);
      // Killed after the charge but before its save, the step runs again: the provider's key dedupes it.
      expect(result.attempts).toBe(crash === 'inside-charged' ? 2 : 1);
    });
    it('killed after charged, finished by the completer with no retry; the late retry replays it', async () => {
      ready ??= await setup();
      const result = await crashThenRetry(kind, ready, 'charged', 'complete');
      expect(result).toEqual({ fines: ['paid'], charges: 1, attempts: 1 });
    });
  });
}

const sqliteFile = join(dir, 'store.db');
describeCrashes(
  'sqlite',
  SQL_CRASHES,
  async () => ({
    target: sqliteFile,
    fines: async (key) => fineStatuses(sqliteFile, key),
  }),
  async () => undefined,
);

const schema = uniqueName('rs_steps');
describe.skipIf(!hasPostgres)('postgres', () => {
  describeCrashes(
    'postgres',
    SQL_CRASHES,
    async () => ({
      target: schema,
      fines: async (key) => {
        const client = new pg.Client({ connectionString: PG_URL });
        await client.connect();
        const { rows } = await client.query(`SELECT status FROM "${schema}".fine WHERE key = $1`, [key]);
        await client.end();
        return rows.map((row) => row.status);
      },
    }),
    () => dropSchemas(schema),
  );
});

const prefix = `${uniqueName('rs_steps')}:`;
describe.skipIf(!hasRedis)('redis', () => {
  describeCrashes(
    'redis',
    ['recorded', 'charged', 'paid', 'inside-charged'],
    async () => ({
      target: prefix,
      fines: async (key, providerFile) => fineStatuses(providerFile, key),
    }),
    async () => {
      const redis = new Redis(REDIS_URL);
      const keys = await redis.keys(`${prefix}*`);
      if (keys.length > 0) await redis.del(...keys);
      await redis.quit();
    },
  );
});
