import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readdirSync } from 'node:fs';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { createRetryingFetch } from '../../src/client/index.js';
import { type LoanDesk, listLoans, postLoan, startLoanDesk } from '../support/loan-desk.js';
import { hasPostgres, PG_URL, uniqueName } from '../support/services.js';

/**
 * The loan desk while its database (PostgreSQL) or its key store (a private Redis) goes away and
 * comes back under a steady flow of keyed loans from several clients that retry each intent with
 * one key: answers during the outage are JSON 503s, nothing hangs, the desk stays up, recovers by
 * itself, and every intent ends with exactly one loan.
 */

const run = promisify(execFile);
const CLUSTER_VERSION = hasPostgres ? (readdirSync('/etc/postgresql')[0] ?? '') : '';
const pgctl = (action: 'restart' | 'start') =>
  run('pg_ctlcluster', ['--skip-systemctl-redirect', CLUSTER_VERSION, 'main', action]);

/** Client loops sending intents one after another; modest, the machine has two cores. */
const CLIENTS = 6;
/** Answered loans before the fault is injected, so it lands on a desk in full flow. */
const WARM_UP_LOANS = 12;
/** The bound on one attempt: past it the attempt counts as a hang. */
const HANG_BOUND_MS = 10_000;
/** How long the desk gets to answer a new intent with 201 once the dependency is back. */
const RECOVERY_BOUND_MS = 20_000;
/** A retried intent gives up after this; long enough to outlast an outage and a lease. */
const INTENT_DEADLINE_MS = 60_000;
/** The answers that mean "send the same intent again" which the desk may give during an outage. */
const TRANSIENT_ANSWER = /^(503 (store|database)_unavailable|409 request_in_progress)$/;
const DAY_MS = 86_400_000;

interface LoanBody {
  member: string;
  isbn: string;
  issuedAt: string;
}

interface Attempt {
  startMs: number;
  endMs: number;
  /** `hung`: no answer within HANG_BOUND_MS; `network`: the connection failed. */
  outcome: { status: number; text: string } | 'hung' | 'network';
}

interface Intent {
  key: string;
  body: LoanBody;
  startMs: number;
  /** The answer the client ended with, or why it gave up. */
  final: { status: number; body: any; replayed: boolean } | { error: string };
}

/**
 * CLIENTS loops, each sending one intent after another through `retrysafe/client`: its own key and
 * a body no other intent has (the issue date), the same key on every retry. Every attempt is kept.
 */
function startFlow(baseUrl: string) {
  const attempts: Attempt[] = [];
  const intents: Intent[] = [];
  let sequence = 0;
  let stopping = false;
  const retryingFetch = createRetryingFetch({
    maxAttempts: 1000,
    deadlineMs: INTENT_DEADLINE_MS,
    attemptTimeoutMs: HANG_BOUND_MS,
    baseDelayMs: 50,
    maxDelayMs: 500,
    async fetch(request, init) {
      const startMs = Date.now();
      try {
        const response = await fetch(request, init);
        const text = await response.clone().text();
        attempts.push({ startMs, endMs: Date.now(), outcome: { status: response.status, text } });
        return response;
      } catch (error) {
        // No caller signal is given: an aborted attempt is one the client's attempt timeout cut off.
        attempts.push({ startMs, endMs: Date.now(), outcome: init.signal.aborted ? 'hung' : 'network' });
        throw error;
      }
    },
  });

  async function send(): Promise<void> {
    const n = sequence++;
    const body: LoanBody = {
      member: `U-${1001 + (n % 10)}`,
      isbn: `K-${String(1 + (n % 10)).padStart(2, '0')}`,
      issuedAt: new Date(Date.UTC(2030, 0, 1) + n * DAY_MS).toISOString().slice(0, 10),
    };
    const intent: Intent = { key: `flow-${randomUUID()}`, body, startMs: Date.now(), final: { error: '' } };
    try {
      const response = await retryingFetch(`${baseUrl}/loans`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        idempotencyKey: intent.key,
      });
      const text = await response.text();
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = text;
      }
      intent.final = {
        status: response.status,
        body: parsed,
        replayed: response.headers.get('idempotency-replayed') === 'true',
      };
    } catch (error) {
      intent.final = { error: String(error) };
    }
    intents.push(intent);
  }

  const loops = Array.from({ length: CLIENTS }, async () => {
    while (!stopping) await send();
  });
  const probes: Promise<void>[] = [];

  return {
    attempts,
    intents,
    loaned: () => intents.filter((i) => 'status' in i.final && i.final.status === 201).length,
    /**
     * One more intent, sent now: the loops may be sleeping on a `Retry-After`, and this one's first
     * attempt shows when the desk lends again.
     */
    probe(): void {
      probes.push(send());
    },
    /** Lets every loop finish the intent it is on, then resolves. */
    async stop(): Promise<void> {
      stopping = true;
      await Promise.all([...loops, ...probes]);
    },
  };
}

type Flow = ReturnType<typeof startFlow>;

async function until(condition: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`${what} did not happen within ${timeoutMs} ms`);
    await sleep(20);
  }
}

/** What the flow saw around an outage from `downMs` to `upMs` (the dependency answering again). */
function summarize(flow: Flow, downMs: number, upMs: number) {
  const failures = flow.attempts.flatMap((a) =>
    typeof a.outcome === 'string' || a.outcome.status === 201 ? [] : [{ ...a.outcome, endMs: a.endMs }],
  );
  // The first intent answered 201 whose attempt started after the dependency was back.
  const recoveredAt = flow.attempts
    .filter((a) => a.startMs >= upMs && typeof a.outcome !== 'string' && a.outcome.status === 201)
    .reduce((first, a) => Math.min(first, a.endMs), Number.POSITIVE_INFINITY);
  const countBy = (values: string[]) =>
    Object.fromEntries(
      [...new Set(values)].map((value) => [value, values.filter((v) => v === value).length]),
    );
  return {
    intents: flow.intents.length,
    attempts: flow.attempts.length,
    hung: flow.attempts.filter((a) => a.outcome === 'hung').length,
    networkErrors: flow.attempts.filter((a) => a.outcome === 'network').length,
    failuresByAnswer: countBy(failures.map((r) => `${r.status} ${errorCode(r.text)}`)),
    outageMs: upMs - downMs,
    status503: failures.filter((r) => r.status === 503).length,
    failuresBeforeTheFault: failures.filter((r) => r.endMs < downMs).length,
    recoveryMs: recoveredAt - upMs,
    slowestAttemptMs: Math.max(...flow.attempts.map((a) => a.endMs - a.startMs)),
  };
}

function errorCode(text: string): string {
  try {
    const code = JSON.parse(text)?.error;
    return typeof code === 'string' ? code : 'no error code';
  } catch {
    return 'not JSON';
  }
}

/**
 * Every attempt was answered, within the bound, and every answer that was not a loan is a JSON
 * error saying "retry with the same key". A dropped connection would mean a desk process died.
 */
function expectOnlyTransientFailures(flow: Flow): void {
  for (const attempt of flow.attempts) {
    expect(attempt.outcome).not.toBe('hung');
    expect(attempt.outcome).not.toBe('network');
    if (typeof attempt.outcome === 'string' || attempt.outcome.status === 201) continue;
    const { status, text } = attempt.outcome;
    expect(`${status} ${errorCode(text)}`).toMatch(TRANSIENT_ANSWER);
  }
}

/** Every intent got its loan, and the desk holds exactly one loan per intent. */
async function expectOneLoanPerIntent(desk: LoanDesk, flow: Flow): Promise<void> {
  for (const intent of flow.intents) {
    expect(intent.final, JSON.stringify(intent)).toMatchObject({ status: 201, body: intent.body });
  }
  const loans = await listLoans(desk.baseUrl);
  const perIntent = new Map<string, number>();
  for (const loan of loans)
    perIntent.set(String(loan.issuedAt), (perIntent.get(String(loan.issuedAt)) ?? 0) + 1);
  const duplicated = [...perIntent].filter(([, count]) => count > 1);
  expect(duplicated).toEqual([]);
  expect(loans).toHaveLength(flow.intents.length);
  // The id each client was given is the loan that exists for its intent.
  const idOf = new Map(loans.map((loan) => [String(loan.issuedAt), loan.id]));
  for (const intent of flow.intents) {
    expect(idOf.get(intent.body.issuedAt)).toBe((intent.final as { body: { id: number } }).body.id);
  }
}

function expectDeskAlive(desk: LoanDesk): void {
  expect(() => process.kill(desk.pid, 0)).not.toThrow();
  expect(desk.output()).not.toMatch(/died|failed to start|uncaught|unhandled|handler failed/i);
}

async function databaseUp(): Promise<boolean> {
  const client = new pg.Client({ connectionString: PG_URL, connectionTimeoutMillis: 1000 });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

describe.skipIf(!hasPostgres)('loan desk on PostgreSQL while the cluster restarts', () => {
  const schemas: string[] = [];

  afterAll(async () => {
    // Whatever happened above, leave the shared cluster running.
    if (!(await databaseUp())) await pgctl('start');
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    for (const schema of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.end();
  });

  it('atomic mode: a loan blocked in its transaction when the cluster goes down is a JSON 503; its retry lends once', async () => {
    const schema = uniqueName('rs_desk_pg_restart');
    schemas.push(schema);
    const desk = await startLoanDesk({ env: { DATABASE_URL: `${PG_URL}?schema=${schema}` } });
    const admin = new pg.Client({ connectionString: PG_URL });
    const locker = new pg.Client({ connectionString: PG_URL });
    for (const client of [admin, locker]) {
      client.on('error', () => {});
      await client.connect();
    }
    try {
      // The claim goes through; the loan's INSERT then waits on the table lock, inside the
      // transaction holding the claim, until the restart cuts the connection under it.
      await locker.query('BEGIN');
      await locker.query(`LOCK TABLE "${schema}".loan IN EXCLUSIVE MODE`);
      const body = { member: 'U-1001', isbn: 'K-01', issuedAt: '2030-01-01' };
      const key = `blocked-${randomUUID()}`;
      const pending = postLoan(desk.baseUrl, body, { key });
      const blocked = async () =>
        (
          await admin.query(
            `SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
            [`%INSERT INTO "${schema}".loan%`],
          )
        ).rowCount === 1;
      const deadline = Date.now() + 10_000;
      while (!(await blocked())) {
        if (Date.now() > deadline) throw new Error('the loan never waited on the lock');
        await sleep(20);
      }
      await pgctl('restart');
      const failed = await Promise.race([pending, sleep(HANG_BOUND_MS).then(() => 'hung' as const)]);
      if (failed === 'hung') throw new Error(`no answer within ${HANG_BOUND_MS} ms`);
      expect(`${failed.status} ${errorCode(failed.text)}`).toMatch(/^503 (store|database)_unavailable$/);
      expect(failed.headers.get('content-type')).toMatch(/^application\/json/);
      expect(desk.output()).toMatch(/loan desk: lending failed/);

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
    '$name: 503 JSON during the outage, recovery, one loan per intent',
    async ({ workers, env }) => {
      const schema = uniqueName('rs_desk_pg_restart');
      schemas.push(schema);
      const desk = await startLoanDesk({
        workers,
        env: { DATABASE_URL: `${PG_URL}?schema=${schema}`, ...env },
      });
      try {
        const flow = startFlow(desk.baseUrl);
        await until(() => flow.loaned() >= WARM_UP_LOANS, 20_000, 'the warm-up');
        const downMs = Date.now();
        await pgctl('restart');
        const upMs = Date.now();
        flow.probe();
        const loanedBefore = flow.loaned();
        await until(() => flow.loaned() >= loanedBefore + 2 * CLIENTS, RECOVERY_BOUND_MS, 'recovery');
        await flow.stop();

        const seen = summarize(flow, downMs, upMs);
        console.log(`loan desk on PostgreSQL, ${workers} worker(s) ${JSON.stringify(env)}:`, seen);
        expectOnlyTransientFailures(flow);
        expect(seen.status503).toBeGreaterThan(0);
        expect(seen.failuresBeforeTheFault).toBe(0);
        expect(seen.recoveryMs).toBeLessThanOrEqual(RECOVERY_BOUND_MS);
        expectDeskAlive(desk);
        await expectOneLoanPerIntent(desk, flow);
      } finally {
        expect(await desk.stop()).toBe(0);
      }
    },
  );
});

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
    server.once('error', reject);
  });
}

/** A Redis of this test's own, without persistence, as a cache-style deployment runs it. */
async function startRedis(port: number): Promise<ChildProcess> {
  const child = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`redis-server did not start:\n${output}`)), 10_000);
    child.stdout!.setEncoding('utf8').on('data', (text: string) => {
      output += text;
      if (output.includes('Ready to accept connections')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`redis-server exited (${code}):\n${output}`));
    });
  });
  child.removeAllListeners('exit');
  return child;
}

async function kill9(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}

describe('loan desk with keys in a Redis that is killed and restarted empty', () => {
  let redis: ChildProcess | undefined;
  afterAll(async () => {
    if (redis) await kill9(redis);
  });

  it('503 JSON while Redis is down, recovery, one loan per intent; a completed key is forgotten', async () => {
    const port = await freePort();
    redis = await startRedis(port);
    const desk = await startLoanDesk({
      env: { IDEMPOTENCY_STORE: `redis://127.0.0.1:${port}?prefix=${uniqueName('rs_desk_redis')}:` },
    });
    try {
      const flow = startFlow(desk.baseUrl);
      await until(() => flow.loaned() >= WARM_UP_LOANS, 20_000, 'the warm-up');
      const downMs = Date.now();
      await kill9(redis);
      // Long enough for every client loop to meet the outage.
      await sleep(1500);
      redis = await startRedis(port);
      const upMs = Date.now();
      flow.probe();
      const loanedBefore = flow.loaned();
      await until(() => flow.loaned() >= loanedBefore + 2 * CLIENTS, RECOVERY_BOUND_MS, 'recovery');
      await flow.stop();

      const seen = summarize(flow, downMs, upMs);
      console.log('loan desk with keys in Redis (lease mode), loans in SQLite:', seen);
      expectOnlyTransientFailures(flow);
      expect(seen.status503).toBeGreaterThan(0);
      expect(seen.failuresBeforeTheFault).toBe(0);
      expect(seen.recoveryMs).toBeLessThanOrEqual(RECOVERY_BOUND_MS);
      expectDeskAlive(desk);
      // The clients only ever resent an intent the desk had answered with a 503 (nothing lent) or
      // a 409 (still in progress): none of them lent twice, across the outage and the restart.
      await expectOneLoanPerIntent(desk, flow);

      // The documented trade-off of a Redis without persistence: it came back empty, so a retry
      // of an intent completed before the restart (say its 201 was lost) lends again, while one
      // completed after the restart replays.
      const before = flow.intents.filter((i) => i.startMs < downMs).slice(0, 3);
      const after = flow.intents.filter((i) => i.startMs > upMs).slice(0, 3);
      expect(before).toHaveLength(3);
      expect(after).toHaveLength(3);
      const resent = async (intent: Intent) => postLoan(desk.baseUrl, intent.body, { key: intent.key });
      for (const intent of after) {
        const again = await resent(intent);
        expect(again.headers.get('idempotency-replayed')).toBe('true');
        expect(again.body).toEqual((intent.final as { body: unknown }).body);
      }
      for (const intent of before) {
        const again = await resent(intent);
        expect(again.status).toBe(201);
        expect(again.headers.get('idempotency-replayed')).toBeNull();
        expect(again.body.id).not.toBe((intent.final as { body: { id: number } }).body.id);
      }
      const loans = await listLoans(desk.baseUrl);
      expect(loans).toHaveLength(flow.intents.length + before.length);
      console.log(
        `after the Redis restart: ${before.length} intents completed before it lent again when resent, ${after.length} completed after it replayed`,
      );
    } finally {
      expect(await desk.stop()).toBe(0);
    }
  });
});
