import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { promisify } from 'node:util';
import Database from 'better-sqlite3';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { fingerprint } from '../src/core/request/index.js';
import {
  getJson,
  type LoanDesk,
  type LoanResponse,
  listLoans,
  postLoan,
  ROOT,
  startLoanDesk,
  tempDatabaseUrl,
  withLoanDesk,
} from './support/loan-desk.js';
import { dropSchemas, hasPostgres, hasRedis, PG_URL, REDIS_URL, uniqueName } from './support/services.js';
import { sqliteRows } from './support/sqlite-rows.js';

/**
 * The loan desk under processes, crashes, clocks and broken dependencies: WORKERS=N, kill -9 mid
 * flight and restart, retention expiry, purge (timer and CLI), required keys, a dead key store.
 */

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const DAY_MS = 86_400_000;
let intents = 0;
function intent() {
  intents++;
  return {
    member: `U-${1001 + (intents % 10)}`,
    isbn: `K-${String(1 + (intents % 10)).padStart(2, '0')}`,
    issuedAt: new Date(Date.UTC(2025, 0, 1) + intents * DAY_MS).toISOString().slice(0, 10),
  };
}
const key = (label = 'K') => `${label}-${randomUUID()}`;

/** What a careful client does after a crash: resend with the same key until the answer is final. */
async function resendUntilFinal(baseUrl: string, body: object, k: string): Promise<LoanResponse> {
  for (let attempt = 1; ; attempt++) {
    const response = await postLoan(baseUrl, body, { key: k }).catch(() => undefined);
    const transient =
      response === undefined || response.status === 503 || response.body?.error === 'request_in_progress';
    if (!transient || attempt === 60) return response!;
    await sleep(250);
  }
}

const pgSchemas: string[] = [];
function pgDatabaseUrl(): string {
  const schema = uniqueName('rs_loan_faults');
  pgSchemas.push(schema);
  return `${PG_URL}?schema=${schema}`;
}
afterAll(() => dropSchemas(...pgSchemas));

const databases = [
  { name: 'SQLite', skip: false, url: () => tempDatabaseUrl() },
  { name: 'PostgreSQL', skip: !hasPostgres, url: pgDatabaseUrl },
];

describe.each(databases)('loan desk on $name, atomic mode', ({ skip, url }) => {
  it.skipIf(skip)('WORKERS=4: 60 concurrent requests with one key make one loan', async () => {
    const desk = await startLoanDesk({ workers: 4, env: { DATABASE_URL: url() } });
    try {
      const k = key('OD');
      const body = intent();
      const responses = await Promise.all(
        Array.from({ length: 60 }, () => postLoan(desk.baseUrl, body, { key: k })),
      );
      expect(responses.map((r) => r.status)).toEqual(Array(60).fill(201));
      expect(new Set(responses.map((r) => r.text)).size).toBe(1);
      expect(await listLoans(desk.baseUrl)).toHaveLength(1);
      // Every worker reached the same database: keyless requests spread over them all count too.
      await Promise.all(Array.from({ length: 20 }, () => postLoan(desk.baseUrl, intent())));
      expect(await listLoans(desk.baseUrl)).toHaveLength(21);
    } finally {
      expect(await desk.stop()).toBe(0);
    }
  });

  it.skipIf(skip)('kill -9 with 40 keyed requests in flight, restart, resend: exactly 40 loans', async () => {
    const env = { DATABASE_URL: url() };
    const desk = await startLoanDesk({ env });
    const plan = Array.from({ length: 40 }, () => ({ key: key('crash'), body: intent() }));
    const inFlight = plan.map((p) => postLoan(desk.baseUrl, p.body, { key: p.key }).catch(() => undefined));
    // The power goes out as soon as the first answer is out: the others are somewhere in between.
    await Promise.race(inFlight);
    await desk.kill9();
    const beforeCrash = await Promise.all(inFlight);

    const restarted = await startLoanDesk({ env: { ...env, DATABASE_URL: desk.databaseUrl } });
    try {
      // Every loan whose 201 left the desk survived the crash.
      const survived = await listLoans(restarted.baseUrl);
      expect(survived.length).toBeGreaterThanOrEqual(beforeCrash.filter((r) => r?.status === 201).length);
      const finals = await Promise.all(plan.map((p) => resendUntilFinal(restarted.baseUrl, p.body, p.key)));
      finals.forEach((response, i) => {
        expect(response.status).toBe(201);
        expect(response.body).toMatchObject(plan[i]!.body);
        const early = beforeCrash[i];
        // An answer the client did see before the crash is the one it gets again.
        if (early?.status === 201) {
          expect(response.text).toBe(early.text);
          expect(response.headers.get('idempotency-replayed')).toBe('true');
        }
      });
      const loans = await listLoans(restarted.baseUrl);
      expect(loans).toHaveLength(40);
      expect(new Set(finals.map((r) => r.body.id))).toEqual(new Set(loans.map((l) => l.id)));
    } finally {
      expect(await restarted.stop()).toBe(0);
    }
  });
});

/** Rows of the desk's SQLite key table (the loans' keys: its outbox sends receipts without one). */
function keyRows(desk: LoanDesk): number {
  return sqliteRows<{ n: number }>(desk.databaseUrl, 'SELECT count(*) AS n FROM idempotency_keys')[0]!.n;
}

describe('loan desk on SQLite, lease mode', () => {
  it('a key held by a live owner is 409 request_in_progress after IDEMPOTENCY_WAIT; a dead owner is taken over once its lease passes', async () => {
    const desk = await startLoanDesk({ env: { IDEMPOTENCY_MODE: 'lease', IDEMPOTENCY_WAIT: '300ms' } });
    const db = new Database(desk.databaseUrl);
    try {
      const k = key('OD');
      const body = JSON.stringify(intent());
      // The record a process leaves when it dies after claiming the key and before lending the book.
      const print = fingerprint({
        method: 'POST',
        path: '/loans',
        contentType: 'application/json',
        body: Buffer.from(body),
      });
      const nowMs = Date.now();
      db.prepare(
        `INSERT INTO idempotency_keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
         VALUES ('anonymous', ?, ?, 'dead-owner', ?, ?, ?)`,
      ).run(k, print, nowMs + 60_000, nowMs, nowMs + DAY_MS);

      const busy = await postLoan(desk.baseUrl, body, { key: k });
      expect(busy.status).toBe(409);
      expect(busy.body.error).toBe('request_in_progress');
      expect(Number(busy.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect((await postLoan(desk.baseUrl, intent(), { key: k })).body.error).toBe('key_conflict');
      expect(await listLoans(desk.baseUrl)).toHaveLength(0);

      db.prepare('UPDATE idempotency_keys SET lease_until_ms = ? WHERE key = ?').run(Date.now() - 1, k);
      const takenOver = await postLoan(desk.baseUrl, body, { key: k });
      expect(takenOver.status).toBe(201);
      expect((await postLoan(desk.baseUrl, body, { key: k })).headers.get('idempotency-replayed')).toBe(
        'true',
      );
      expect(await listLoans(desk.baseUrl)).toHaveLength(1);
    } finally {
      db.close();
      await desk.stop();
    }
  });

  it('kill -9 mid-flight: after restart no key stays stuck beyond its lease', async () => {
    const env = { DATABASE_URL: tempDatabaseUrl(), IDEMPOTENCY_MODE: 'lease', IDEMPOTENCY_LEASE: '1s' };
    const desk = await startLoanDesk({ env });
    const plan = Array.from({ length: 40 }, () => ({ key: key('crash'), body: intent() }));
    const inFlight = plan.map((p) => postLoan(desk.baseUrl, p.body, { key: p.key }).catch(() => undefined));
    await Promise.race(inFlight);
    await desk.kill9();
    const unanswered = (await Promise.all(inFlight)).filter((r) => r?.status !== 201).length;
    const restarted = await startLoanDesk({ env });
    try {
      const finals = await Promise.all(plan.map((p) => resendUntilFinal(restarted.baseUrl, p.body, p.key)));
      expect(finals.map((r) => r.status)).toEqual(Array(40).fill(201));
      // Lease mode's documented limit: a crash between the loan and the saved answer may lend twice.
      const loans = await listLoans(restarted.baseUrl);
      expect(loans.length).toBeGreaterThanOrEqual(40);
      expect(loans.length).toBeLessThanOrEqual(40 + unanswered);
    } finally {
      await restarted.stop();
    }
  });
});

describe.skipIf(!hasPostgres)('loan desk on PostgreSQL: two instances of WORKERS=2 on one database', () => {
  /** The two instances, on a new database of their own. */
  const twoInstances = () => {
    const env = { DATABASE_URL: pgDatabaseUrl() };
    return Promise.all([startLoanDesk({ workers: 2, env }), startLoanDesk({ workers: 2, env })]);
  };

  it('200 requests over 20 keys sprayed over both make 20 loans, one answer per key', async () => {
    const [a, b] = await twoInstances();
    try {
      const plan = Array.from({ length: 20 }, () => ({ key: key('OD'), body: intent() }));
      const sent = Array.from({ length: 200 }, (_, i) => {
        const { key: k, body } = plan[i % 20]!;
        return postLoan((i % 2 === 0 ? a : b).baseUrl, body, { key: k }).then((r) => ({ k, r }));
      });
      const answers = new Map<string, Set<string>>();
      for (const { k, r } of await Promise.all(sent)) {
        expect(r.status).toBe(201);
        answers.set(k, (answers.get(k) ?? new Set()).add(r.text));
      }
      expect([...answers.values()].map((texts) => texts.size)).toEqual(Array(20).fill(1));
      expect(await listLoans(a.baseUrl)).toHaveLength(20);
    } finally {
      await Promise.all([a.stop(), b.stop()]);
    }
  });

  it('kill -9 of one instance mid-flight; the retries through the other make one loan per intent', async () => {
    const [a, b] = await twoInstances();
    try {
      const plan = Array.from({ length: 40 }, () => ({ key: key('crash'), body: intent() }));
      const inFlight = plan.map((p) => postLoan(a.baseUrl, p.body, { key: p.key }).catch(() => undefined));
      await Promise.race(inFlight);
      await a.kill9();
      await Promise.all(inFlight);
      const finals = await Promise.all(plan.map((p) => resendUntilFinal(b.baseUrl, p.body, p.key)));
      finals.forEach((response, i) => {
        expect(response.status).toBe(201);
        expect(response.body).toMatchObject(plan[i]!.body);
      });
      expect(await listLoans(b.baseUrl)).toHaveLength(40);
    } finally {
      await a.kill9();
      await b.stop();
    }
  });
});

describe('loan desk on SQLite', () => {
  it('IDEMPOTENCY_TTL=2s: after 3 s the same key is a new operation', async () => {
    await withLoanDesk({ env: { IDEMPOTENCY_TTL: '2s' } }, async (desk) => {
      const k = key('OD');
      const body = intent();
      const first = await postLoan(desk.baseUrl, body, { key: k });
      const replay = await postLoan(desk.baseUrl, body, { key: k });
      expect(replay.headers.get('idempotency-replayed')).toBe('true');
      expect(replay.body.id).toBe(first.body.id);
      await sleep(3000);
      const later = await postLoan(desk.baseUrl, body, { key: k });
      expect(later.status).toBe(201);
      expect(later.headers.get('idempotency-replayed')).toBeNull();
      expect(later.body.id).not.toBe(first.body.id);
      expect(await listLoans(desk.baseUrl)).toHaveLength(2);
    });
  });

  it('restart on the same file keeps loans and keys and does not duplicate the catalog', async () => {
    const desk = await startLoanDesk();
    const k = key('OD');
    const body = intent();
    const first = await postLoan(desk.baseUrl, body, { key: k });
    expect(await desk.stop()).toBe(0);
    const again = await startLoanDesk({ env: { DATABASE_URL: desk.databaseUrl } });
    try {
      expect((await getJson(again.baseUrl, '/books')).body).toHaveLength(10);
      const replay = await postLoan(again.baseUrl, body, { key: k });
      expect(replay.text).toBe(first.text);
      expect(replay.headers.get('idempotency-replayed')).toBe('true');
      expect(await listLoans(again.baseUrl)).toHaveLength(1);
    } finally {
      await again.stop();
    }
  });

  it('expired keys are purged by the timer', async () => {
    await withLoanDesk({ env: { IDEMPOTENCY_TTL: '2s', PURGE_INTERVAL: '250ms' } }, async (desk) => {
      for (let i = 0; i < 3; i++)
        expect((await postLoan(desk.baseUrl, intent(), { key: key() })).status).toBe(201);
      expect(keyRows(desk)).toBe(3);
      await sleep(3000);
      expect(keyRows(desk)).toBe(0);
      expect(await listLoans(desk.baseUrl)).toHaveLength(3);
    });
  });

  it('the purge command deletes expired keys on demand', async () => {
    const desk = await startLoanDesk({ env: { IDEMPOTENCY_TTL: '1s', PURGE_INTERVAL: '1h' } });
    for (let i = 0; i < 3; i++) await postLoan(desk.baseUrl, intent(), { key: key() });
    expect(keyRows(desk)).toBe(3);
    await desk.stop();
    await sleep(1200);
    const env = { ...process.env, DATABASE_URL: desk.databaseUrl };
    const purge = () => run(process.execPath, ['examples/library-loans/purge.js'], { cwd: ROOT, env });
    expect((await purge()).stdout).toMatch(/^purged 3 expired keys \(SQLite /);
    expect((await purge()).stdout).toMatch(/^purged 0 expired keys/);
  });

  /** Sends a keyed loan while another connection holds SQLite's write lock, as a long job would. */
  async function postWhileLocked(desk: { baseUrl: string; databaseUrl: string }, body: object, k: string) {
    const locker = new Database(desk.databaseUrl);
    locker.exec('BEGIN IMMEDIATE');
    try {
      return await postLoan(desk.baseUrl, body, { key: k });
    } finally {
      locker.exec('ROLLBACK');
      locker.close();
    }
  }

  it('atomic mode: a database that stays locked answers 503, lends nothing, and the retry works', async () => {
    await withLoanDesk({}, async (desk) => {
      const k = key('OD');
      const body = intent();
      const failed = await postWhileLocked(desk, body, k);
      expect(failed.status).toBe(503);
      expect(failed.body.error).toBe('store_unavailable');
      const retry = await postLoan(desk.baseUrl, body, { key: k });
      expect(retry.status).toBe(201);
      expect(retry.headers.get('idempotency-replayed')).toBeNull();
      expect(await listLoans(desk.baseUrl)).toHaveLength(1);
    });
  });

  it('lease mode: a loan the locked database refuses is 503, the key is released and the retry runs again', async () => {
    await withLoanDesk({ env: { IDEMPOTENCY_STORE: 'memory' } }, async (desk) => {
      const k = key('OD');
      const body = intent();
      const failed = await postWhileLocked(desk, body, k);
      expect(failed.status).toBe(503);
      expect(failed.body.error).toBe('database_unavailable');
      // A 503 says when to come back, as the engine's own 503s do.
      expect(failed.headers.get('retry-after')).toBe('1');
      const retry = await postLoan(desk.baseUrl, body, { key: k });
      expect(retry.status).toBe(201);
      expect(retry.headers.get('idempotency-replayed')).toBeNull();
      expect((await postLoan(desk.baseUrl, body, { key: k })).headers.get('idempotency-replayed')).toBe(
        'true',
      );
      expect(await listLoans(desk.baseUrl)).toHaveLength(1);
    });
  });

  it('IDEMPOTENCY_REQUIRED=true: a POST without a key is 400 and lends nothing', async () => {
    await withLoanDesk({ env: { IDEMPOTENCY_REQUIRED: 'true' } }, async (desk) => {
      const missing = await postLoan(desk.baseUrl, intent());
      expect(missing.status).toBe(400);
      expect(missing.body.error).toBe('idempotency_key_missing');
      expect(await listLoans(desk.baseUrl)).toHaveLength(0);
      expect((await postLoan(desk.baseUrl, intent(), { key: key() })).status).toBe(201);
    });
  });

  it('a key store that cannot be reached answers 503 JSON, never hangs, and lends nothing', async () => {
    const deadPort = await new Promise<number>((resolve) => {
      const server = net.createServer().listen(0, '127.0.0.1', () => {
        const { port } = server.address() as net.AddressInfo;
        server.close(() => resolve(port));
      });
    });
    const desk = await startLoanDesk({
      env: { IDEMPOTENCY_STORE: `redis://127.0.0.1:${deadPort}`, ADMIN_LOOPBACK: '1' },
    });
    try {
      const refused = await postLoan(desk.baseUrl, intent(), { key: key() });
      expect(refused.status).toBe(503);
      expect(refused.body.error).toBe('store_unavailable');
      expect(await listLoans(desk.baseUrl)).toHaveLength(0);
      // The admin API says when to come back, as the guarded route does.
      const admin = await fetch(`${desk.baseUrl}/admin/keys`);
      expect(admin.status).toBe(503);
      expect(admin.headers.get('retry-after')).toBe('1');
      // Requests that need no key store are unaffected.
      expect((await postLoan(desk.baseUrl, intent())).status).toBe(201);
    } finally {
      await desk.stop();
    }
    expect(desk.output()).toMatch(
      new RegExp(
        `IDEMPOTENCY_STORE \\(Redis at 127.0.0.1:${deadPort}\\) does not answer: .+; keyed loans answer 503`,
      ),
    );
  });

  it('a setting that cannot work stops the start with the variable named', async () => {
    await expect(
      startLoanDesk({ env: { IDEMPOTENCY_STORE: 'memory', IDEMPOTENCY_MODE: 'atomic' } }),
    ).rejects.toThrow(/IDEMPOTENCY_MODE="atomic" is invalid/);
    await expect(startLoanDesk({ env: { IDEMPOTENCY_TTL: 'forever' } })).rejects.toThrow(/IDEMPOTENCY_TTL/);
  });
});

describe.skipIf(!hasRedis)('loan desk with keys in Redis (lease mode), loans in SQLite', () => {
  const prefix = `${uniqueName('rs_loan_desk')}:`;
  afterAll(async () => {
    const redis = new Redis(REDIS_URL);
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    await redis.quit();
  });

  it('replays, rejects a reused key, and makes one loan of 20 concurrent requests', async () => {
    await withLoanDesk({ env: { IDEMPOTENCY_STORE: `${REDIS_URL}?prefix=${prefix}` } }, async (desk) => {
      const k = key('OD');
      const body = intent();
      const responses = await Promise.all(
        Array.from({ length: 20 }, () => postLoan(desk.baseUrl, body, { key: k })),
      );
      expect(new Set(responses.map((r) => `${r.status} ${r.text}`)).size).toBe(1);
      expect(responses[0]!.status).toBe(201);
      expect((await postLoan(desk.baseUrl, intent(), { key: k })).status).toBe(409);
      expect(await listLoans(desk.baseUrl)).toHaveLength(1);
    });
  });
});
