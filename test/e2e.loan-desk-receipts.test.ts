import { setTimeout as sleep } from 'node:timers/promises';
import { Queue } from 'bullmq';
import pg from 'pg';
import { describe, expect, it, vi } from 'vitest';
import { getJson, type LoanDesk, postLoan, startLoanDesk, tempDatabaseUrl } from './support/loan-desk.js';
import { dropSchemas, hasPostgres, hasRedis, PG_URL, REDIS_URL, uniqueName } from './support/services.js';
import { sqliteRows } from './support/sqlite-rows.js';

/**
 * Each new loan's receipt goes through a job (examples/library-loans/receipts.js): an outbox row
 * committed with the loan, claimed in batches and sent in one transaction per batch by every desk
 * worker, or relayed to BullMQ and sent by `idempotent()`. Here LOANS loans are issued to a
 * `WORKERS=3` desk while its workers are SIGKILLed one after another, RECEIPT_DELAY_MS (the desk's
 * test hook, faults/test-hooks.js) holding each batch between its claim and its receipts long
 * enough for the kills to land mid-job. Every loan ends with exactly one receipt row (the receipt
 * table has no unique key on the loan: only the send's fence keeps a second delivery from writing
 * one), and `GET /loans/:id/receipt` answers it.
 */
const LOANS = 200;
const KILLS = 8;
const CLIENTS = 6;
const WAIT = { timeout: 60_000, interval: 100 };

const serving = (desk: LoanDesk) =>
  [...desk.output().matchAll(/^worker (\d+) serving/gm)].map((m) => Number(m[1]));

/** POST /loans with a key of its own, retried with the same key until it answers 201. */
async function lend(desk: LoanDesk, key: string, member: string): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    try {
      const response = await postLoan(
        desk.baseUrl,
        { member, isbn: 'K-02', issuedAt: '2026-03-10' },
        { key },
      );
      if (response.status === 201) return response.body.id;
    } catch {
      // The worker holding the connection was killed: the same key again.
    }
    await sleep(50);
  }
  throw new Error(`loan ${key} was never answered 201`);
}

/**
 * Issues LOANS loans in KILLS rounds; a third into each round a worker is SIGKILLed, and the next
 * round starts once node:cluster has forked its replacement. Answers the loan ids and the kills.
 */
async function lendWhileKilling(desk: LoanDesk): Promise<{ ids: number[]; killed: number[] }> {
  const ids: number[] = [];
  const killed: number[] = [];
  const perRound = LOANS / KILLS;
  for (let round = 0; round < KILLS; round++) {
    let next = round * perRound;
    const end = next + perRound;
    const clients = Array.from({ length: CLIENTS }, async (_, client) => {
      while (next < end) {
        const n = next++;
        ids.push(await lend(desk, `receipt-${n}`, `U-${1001 + (client % 10)}`));
      }
    });
    await vi.waitFor(() => expect(ids.length).toBeGreaterThanOrEqual(round * perRound + perRound / 3), WAIT);
    const alive = serving(desk).filter((pid) => !killed.includes(pid));
    const victim = alive[round % alive.length]!;
    process.kill(victim, 'SIGKILL');
    killed.push(victim);
    await Promise.all(clients);
    await vi.waitFor(() => expect(serving(desk).length).toBe(3 + killed.length), WAIT);
  }
  return { ids, killed };
}

async function receiptsUnderKills(
  label: string,
  env: Record<string, string>,
  receiptRows: () => Promise<number[]>,
) {
  const desk = await startLoanDesk({
    workers: 3,
    env: { RECEIPT_DELAY_MS: '15', IDEMPOTENCY_LEASE: '1s', REDIS_URL: 'none', ...env },
  });
  try {
    await vi.waitFor(() => expect(serving(desk)).toHaveLength(3), WAIT);
    const { ids, killed } = await lendWhileKilling(desk);
    expect(new Set(ids).size).toBe(LOANS);

    await vi.waitFor(async () => {
      for (const id of ids) expect((await getJson(desk.baseUrl, `/loans/${id}/receipt`)).status).toBe(200);
    }, WAIT);
    for (const id of ids) {
      const { body } = await getJson(desk.baseUrl, `/loans/${id}/receipt`);
      expect(body).toMatchObject({ loanId: id, isbn: 'K-02', issuedAt: '2026-03-10' });
    }
    // One receipt row per loan the desk holds: none missing, none twice.
    const perLoan = await receiptRows();
    expect(perLoan).toHaveLength(LOANS);
    expect(perLoan.filter((count) => count !== 1)).toEqual([]);

    const deduplicated = desk.output().match(/receipt delivery deduplicated/g)?.length ?? 0;
    const redelivered = (
      await Promise.all(ids.map((id) => getJson(desk.baseUrl, `/loans/${id}/receipt`)))
    ).filter((r) => r.body.delivery > 1).length;
    console.log(
      `receipts (${label}): ${LOANS} loans, ${killed.length} workers SIGKILLed, ${perLoan.length} receipts (one each), ${deduplicated} deliveries deduplicated, ${redelivered} receipts written by a later delivery`,
    );
    expect(killed).toHaveLength(KILLS);
  } finally {
    expect(await desk.stop()).toBe(0);
  }
}

const receiptsPerLoan = (file: string) => async () =>
  sqliteRows<{ n: number }>(
    file,
    'SELECT count(r.id) AS n FROM loan l LEFT JOIN receipt r ON r.loan_id = l.id GROUP BY l.id',
  ).map((row) => row.n);

describe('GET /loans/:id/receipt', () => {
  it('404 for no such loan, 202 pending with Retry-After while its job runs, then 200 with the receipt', async () => {
    // The job pauses 3 s between its claim (its first attempt, 50 ms after the loan) and the
    // receipt: GETs in between find it pending.
    const desk = await startLoanDesk({ env: { RECEIPT_DELAY_MS: '3000' } });
    try {
      expect((await getJson(desk.baseUrl, '/loans/999/receipt')).body).toEqual({ error: 'loan_not_found' });
      expect((await getJson(desk.baseUrl, '/loans/x/receipt')).status).toBe(404);
      const loan = { member: 'U-1003', isbn: 'K-04', issuedAt: '2026-05-01' };
      const { body: made } = await postLoan(desk.baseUrl, loan);
      const pending = await vi.waitFor(async () => {
        const answer = await getJson(desk.baseUrl, `/loans/${made.id}/receipt`);
        expect(answer.body).toEqual({ status: 'pending', loanId: made.id, attempts: 1 });
        return answer;
      }, WAIT);
      expect(pending.status).toBe(202);
      expect(pending.headers.get('retry-after')).toBe('1');
      await vi.waitFor(
        async () => expect((await getJson(desk.baseUrl, `/loans/${made.id}/receipt`)).status).toBe(200),
        WAIT,
      );
      const { body: receipt } = await getJson(desk.baseUrl, `/loans/${made.id}/receipt`);
      expect(receipt).toEqual({
        loanId: made.id,
        ...loan,
        sentAt: expect.stringMatching(/^\d{4}-\d{2}-\d{2}T/),
        delivery: 1,
        sentBy: expect.any(Number),
      });
      const post = await fetch(`${desk.baseUrl}/loans/${made.id}/receipt`, { method: 'POST' });
      expect([post.status, post.headers.get('allow')]).toEqual([405, 'GET, HEAD']);
    } finally {
      expect(await desk.stop()).toBe(0);
    }
  });

  it('RECEIPTS=0 sends none: the job waits in the outbox until a desk that sends receipts starts', async () => {
    const file = tempDatabaseUrl('receipts-off');
    const quiet = await startLoanDesk({ env: { DATABASE_URL: file, RECEIPTS: '0' } });
    let made: { id: number };
    try {
      made = (await postLoan(quiet.baseUrl, { member: 'U-1002', isbn: 'K-03', issuedAt: '2026-05-02' })).body;
      // Far longer than the 50 ms a desk that sends receipts lets loans gather: it would have sent this one.
      await sleep(1_000);
      const pending = await getJson(quiet.baseUrl, `/loans/${made.id}/receipt`);
      expect([pending.status, pending.body]).toEqual([
        202,
        { status: 'pending', loanId: made.id, attempts: 0 },
      ]);
    } finally {
      expect(await quiet.stop()).toBe(0);
    }
    const sender = await startLoanDesk({ env: { DATABASE_URL: file } });
    try {
      await vi.waitFor(
        async () => expect((await getJson(sender.baseUrl, `/loans/${made.id}/receipt`)).status).toBe(200),
        WAIT,
      );
    } finally {
      expect(await sender.stop()).toBe(0);
    }
    await expect(startLoanDesk({ env: { RECEIPTS: 'no' } })).rejects.toThrow(
      /RECEIPTS="no" is invalid: expected `1` or `0`/,
    );
  });

  it('REDIS_URL that is not a redis:// URL stops the start, naming it', async () => {
    await expect(startLoanDesk({ env: { REDIS_URL: 'http://127.0.0.1:6379' } })).rejects.toThrow(
      /REDIS_URL="http:\/\/127\.0\.0\.1:6379" is invalid: expected a redis:\/\/ URL/,
    );
  });
});

describe('loan desk receipts with workers SIGKILLed mid-job', () => {
  it('SQLite outbox: every loan gets exactly one receipt', { timeout: 180_000 }, async () => {
    const file = tempDatabaseUrl('receipts');
    await receiptsUnderKills('SQLite outbox', { DATABASE_URL: file }, receiptsPerLoan(file));
  });

  it.skipIf(!hasPostgres)(
    'PostgreSQL outbox: every loan gets exactly one receipt',
    { timeout: 180_000 },
    async () => {
      const schema = uniqueName('receipts');
      const url = `${PG_URL}?schema=${schema}`;
      try {
        await receiptsUnderKills('PostgreSQL outbox', { DATABASE_URL: url }, async () => {
          const client = new pg.Client({ connectionString: PG_URL });
          await client.connect();
          try {
            const { rows } = await client.query(
              `SELECT count(r.id)::int AS n FROM "${schema}".loan l LEFT JOIN "${schema}".receipt r ON r.loan_id = l.id GROUP BY l.id`,
            );
            return rows.map((row) => row.n);
          } finally {
            await client.end();
          }
        });
      } finally {
        await dropSchemas(schema);
      }
    },
  );

  it.skipIf(!hasRedis)(
    'BullMQ (REDIS_URL): every loan gets exactly one receipt',
    { timeout: 180_000 },
    async () => {
      const file = tempDatabaseUrl('receipts-bullmq');
      const prefix = `${uniqueName('receipts')}:`;
      try {
        await receiptsUnderKills(
          'SQLite, BullMQ',
          { DATABASE_URL: file, REDIS_URL: `${REDIS_URL}?prefix=${prefix}` },
          receiptsPerLoan(file),
        );
      } finally {
        const queue = new Queue('receipts', { connection: { url: REDIS_URL }, prefix: `${prefix}bull` });
        await queue.obliterate({ force: true });
        await queue.close();
      }
    },
  );
});
