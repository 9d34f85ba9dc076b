import { type ChildProcess, spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from './support/free-port.js';
import { listLoans, postLoan, startLoanDesk } from './support/loan-desk.js';
import { flowThroughFault, type Intent } from './support/loan-flow.js';
import { hasRedis, uniqueName } from './support/services.js';

/**
 * The loan desk with its keys in a Redis of this test's own (never the shared one), killed and
 * restarted empty under a steady flow of keyed loans: JSON 503s while it is down, no hang, no
 * crash, recovery by itself, one loan per intent; then the documented cost of a Redis without
 * persistence, measured.
 */

/** A Redis without persistence, as a cache-style deployment runs it. */
async function startRedis(port: number): Promise<ChildProcess> {
  const child = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`redis-server did not start:\n${output}`)), 10_000);
    const onExit = (code: number | null) => {
      clearTimeout(timer);
      reject(new Error(`redis-server exited (${code}):\n${output}`));
    };
    child.once('exit', onExit);
    child.stdout!.setEncoding('utf8').on('data', (text: string) => {
      output += text;
      if (!output.includes('Ready to accept connections')) return;
      clearTimeout(timer);
      child.off('exit', onExit);
      resolve();
    });
  });
  return child;
}

/**
 * Polls the desk's `GET /health` until its body says `status` (bounded: the test fails past 30 s).
 * Between `unavailable` (open) and `ok` (closed) it may say `recovering` (half-open, a 200) for as
 * long as no request has probed the store yet.
 */
async function healthUntil(baseUrl: string, status: 'unavailable' | 'ok') {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const response = await fetch(`${baseUrl}/health`);
    const body = await response.json();
    if (body.status === status)
      return { httpStatus: response.status, body, retryAfter: response.headers.get('retry-after') };
    if (Date.now() > deadline)
      throw new Error(`GET /health still ${response.status} ${JSON.stringify(body)}`);
    await sleep(50);
  }
}

async function kill9(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}

describe.skipIf(!hasRedis)('loan desk with keys in a Redis that is killed and restarted empty', () => {
  let redis: ChildProcess | undefined;
  afterAll(async () => {
    if (redis) await kill9(redis);
  });

  it('JSON 503s while Redis is down, recovery, one loan per intent; a key completed before the restart is forgotten, its loan is not', async () => {
    const port = await freePort();
    redis = await startRedis(port);
    const desk = await startLoanDesk({
      env: { IDEMPOTENCY_STORE: `redis://127.0.0.1:${port}?prefix=${uniqueName('rs_desk_redis')}:` },
    });
    try {
      // The clients only ever resend an intent the desk answered with a 503 (nothing lent) or a
      // 409 (still in progress), so none lends twice, across the outage and the restart.
      const { intents, downMs, upMs } = await flowThroughFault(
        desk,
        'loan desk with keys in Redis (lease mode), loans in SQLite',
        async () => {
          await kill9(redis!);
          // Long enough for every client loop to meet the outage, and for the failing calls to
          // open the key store's circuit: GET /health says so.
          await sleep(1500);
          const open = await healthUntil(desk.baseUrl, 'unavailable');
          expect(open.httpStatus).toBe(503);
          expect(open.body).toMatchObject({
            status: 'unavailable',
            keyStore: { name: 'redis', circuit: 'open' },
          });
          expect(open.retryAfter).toBe('1');
          redis = await startRedis(port);
          // A client's probe finds Redis again and closes it.
          const closed = await healthUntil(desk.baseUrl, 'ok');
          expect(closed.httpStatus).toBe(200);
          expect(closed.body).toMatchObject({
            status: 'ok',
            keyStore: { circuit: 'closed', failedCalls: 0 },
          });
        },
      );

      // The documented trade-off of a Redis without persistence: it came back empty, so a retry of
      // an intent completed before the restart (say its 201 was lost) lends again, while one
      // completed after the restart replays.
      const before = intents.filter((i) => i.startMs < downMs).slice(0, 3);
      const after = intents.filter((i) => i.startMs > upMs).slice(0, 3);
      expect([before.length, after.length]).toEqual([3, 3]);
      const resend = (intent: Intent) => postLoan(desk.baseUrl, intent.body, { key: intent.key });
      const firstId = (intent: Intent) => (intent.final as { body: { id: number } }).body.id;
      for (const intent of after) {
        const again = await resend(intent);
        expect(again.headers.get('idempotency-replayed')).toBe('true');
        expect(again.body.id).toBe(firstId(intent));
      }
      // Redis forgot these keys, so the handler runs again; the loan keyed by its intent is found
      // instead of a second one being made.
      for (const intent of before) {
        const again = await resend(intent);
        expect(again.status).toBe(201);
        expect(again.headers.get('idempotency-replayed')).toBeNull();
        expect(again.body.id).toBe(firstId(intent));
      }
      expect(await listLoans(desk.baseUrl)).toHaveLength(intents.length);
      console.log(
        `after the Redis restart: ${before.length} of ${before.length} intents completed before it ran again when resent and found their loan; ${after.length} of ${after.length} completed after it replayed`,
      );
    } finally {
      expect(await desk.stop()).toBe(0);
    }
  });
});
