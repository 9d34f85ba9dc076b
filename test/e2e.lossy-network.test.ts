import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { runLossyNetworkAct } from '../examples/library-loans/lossy-demo.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';

/**
 * The proof of issue 5: 1,000 loan intents from 50 concurrent client tasks through a proxy that
 * drops 30 % of responses (after the desk processed them) and refuses 10 % of connections end as
 * exactly 1,000 loans, each task holding its own; without keys the same run creates duplicates.
 */
const INTENTS = 1000;
const TASKS = 50;
const FAULTS = { dropRate: 0.3, refuseRate: 0.1 };

if (!existsSync('dist/client/index.js'))
  throw new Error('run `npm run build` first: the loan desk runs from dist/');

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
    server.once('error', reject);
  });
}

const children = new Set<ChildProcess>();
const tmp = mkdtempSync(join(tmpdir(), 'retrysafe-lossy-'));

async function startDesk(
  env: Record<string, string>,
): Promise<{ baseUrl: string; stop: () => Promise<void> }> {
  const port = await freePort();
  const child = spawn(process.execPath, ['examples/library-loans/server.js'], {
    env: { ...process.env, HOST: '127.0.0.1', PORT: String(port), ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  children.add(child);
  let stderr = '';
  child.stderr?.on('data', (chunk) => {
    stderr += chunk;
  });
  const baseUrl = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    }
    children.delete(child);
  };
  for (let tries = 0; tries < 200; tries++) {
    if (child.exitCode !== null) throw new Error(`loan desk exited: ${stderr}`);
    const ready = await fetch(`${baseUrl}/loans`).then(
      (r) => r.ok,
      () => false,
    );
    if (ready) return { baseUrl, stop };
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  await stop();
  throw new Error(`loan desk did not answer on ${baseUrl}: ${stderr}`);
}

async function loansOf(
  baseUrl: string,
): Promise<{ id: unknown; member: string; isbn: string; issuedAt: string }[]> {
  const body = await (await fetch(`${baseUrl}/loans`)).json();
  return Array.isArray(body) ? body : body.loans;
}

afterAll(async () => {
  for (const child of children) child.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});

async function proveExactlyOnce(env: Record<string, string>) {
  const desk = await startDesk(env);
  try {
    const act = await runLossyNetworkAct({
      baseUrl: desk.baseUrl,
      intents: INTENTS,
      concurrency: TASKS,
      ...FAULTS,
      log: () => {},
    });
    console.log(
      `[lossy network, ${env.DATABASE_URL?.startsWith('postgres') ? 'PostgreSQL' : 'SQLite'}${env.WORKERS ? `, WORKERS=${env.WORKERS}` : ''}] with keys: ` +
        `${act.intents} intents, ${act.attempts} attempts, ${act.drops} responses dropped, ${act.refused} connections refused -> ${act.loans} loans`,
    );
    // The faults really happened, so the retries really were needed.
    expect(act.drops).toBeGreaterThan(INTENTS * 0.15);
    expect(act.refused).toBeGreaterThan(INTENTS * 0.03);

    for (const outcome of act.outcomes) {
      expect(outcome.error).toBeUndefined();
      expect(outcome.status).toBe(201);
      // Its own loan: the body echoes this intent's unique issuedAt, member and isbn.
      expect(outcome.loan).toMatchObject(outcome.intent);
    }
    const learnedIds = act.outcomes.map((o) => String(o.loan?.id));
    expect(new Set(learnedIds).size).toBe(INTENTS);

    const stored = await loansOf(desk.baseUrl);
    expect(stored).toHaveLength(INTENTS);
    expect(act.loans).toBe(INTENTS);
    const storedById = new Map(stored.map((loan) => [String(loan.id), loan]));
    for (const outcome of act.outcomes) {
      expect(storedById.get(String(outcome.loan?.id))).toMatchObject(outcome.intent);
    }
  } finally {
    await desk.stop();
  }
}

describe('lossy network: 1,000 intents, 50 tasks, 30 % dropped responses, 10 % refused connections', () => {
  it('SQLite: exactly one loan per intent, each task learns its own', { timeout: 40_000 }, async () => {
    await proveExactlyOnce({ DATABASE_URL: join(tmp, 'keys.db') });
  });

  it('without keys the same run creates duplicate loans', { timeout: 40_000 }, async () => {
    const desk = await startDesk({ DATABASE_URL: join(tmp, 'nokeys.db') });
    try {
      const act = await runLossyNetworkAct({
        baseUrl: desk.baseUrl,
        intents: INTENTS,
        concurrency: TASKS,
        ...FAULTS,
        keys: false,
        log: () => {},
      });
      const stored = await loansOf(desk.baseUrl);
      const perIntent = new Map<string, number>();
      for (const loan of stored) perIntent.set(loan.issuedAt, (perIntent.get(loan.issuedAt) ?? 0) + 1);
      const duplicates = stored.length - perIntent.size;
      console.log(
        `[lossy network, SQLite] without keys: ${act.intents} intents, ${act.attempts} attempts, ` +
          `${act.drops} responses dropped, ${act.refused} connections refused -> ${stored.length} loans, ` +
          `${duplicates} duplicates`,
      );
      expect(act.answered).toBe(INTENTS);
      expect(perIntent.size).toBe(INTENTS);
      expect(act.duplicates).toBe(duplicates);
      // Every dropped response was a loan made whose answer never arrived; its retry made another.
      expect(duplicates).toBe(act.drops);
      expect(duplicates).toBeGreaterThan(0);
    } finally {
      await desk.stop();
    }
  });
});

describe.skipIf(!hasPostgres)('lossy network on PostgreSQL with WORKERS=2', () => {
  const schema = uniqueName('rs_lossy');
  afterAll(async () => {
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await client.end();
  });

  it('exactly one loan per intent across two processes', { timeout: 40_000 }, async () => {
    const url = new URL(PG_URL);
    url.searchParams.set('schema', schema);
    await proveExactlyOnce({ DATABASE_URL: url.toString(), WORKERS: '2' });
  });
});
