import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { runLossyNetworkAct } from '../examples/library-loans/faults/lossy-demo.js';
import { listLoans, startLoanDesk } from './support/loan-desk.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';

/**
 * The proof of issue 5: 1,000 loan intents from 50 concurrent client tasks through a proxy that
 * drops 30 % of responses (after the desk processed them) and refuses 10 % of connections end as
 * exactly 1,000 loans, each task holding its own; without keys the same run creates duplicates.
 */
const INTENTS = 1000;
const TASKS = 50;
const FAULTS = { dropRate: 0.3, refuseRate: 0.1 };

interface Loan {
  id: unknown;
  member: string;
  isbn: string;
  issuedAt: string;
}

async function lossyRun(label: string, env: Record<string, string>, keys: boolean) {
  const desk = await startLoanDesk({ env });
  try {
    const act = await runLossyNetworkAct({
      baseUrl: desk.baseUrl,
      intents: INTENTS,
      concurrency: TASKS,
      ...FAULTS,
      keys,
      log: () => {},
    });
    const stored = (await listLoans(desk.baseUrl)) as unknown as Loan[];
    console.log(
      `[lossy network, ${label}] ${keys ? 'with' : 'without'} keys: ${act.intents} intents, ` +
        `${act.attempts} attempts, ${act.drops} responses dropped, ${act.refused} connections refused ` +
        `-> ${stored.length} loans (${stored.length - act.intents} duplicates)`,
    );
    // The faults really happened, so the retries really were needed.
    expect(act.drops).toBeGreaterThan(INTENTS * 0.15);
    expect(act.refused).toBeGreaterThan(INTENTS * 0.03);
    return { act, stored };
  } finally {
    await desk.stop();
  }
}

async function proveExactlyOnce(label: string, env: Record<string, string>) {
  const { act, stored } = await lossyRun(label, env, true);
  for (const outcome of act.outcomes) {
    expect(outcome.error).toBeUndefined();
    expect(outcome.status).toBe(201);
    // Its own loan: the body echoes this intent's unique issuedAt, member and isbn.
    expect(outcome.loan).toMatchObject(outcome.intent);
  }
  const learnedIds = act.outcomes.map((o) => String(o.loan?.id));
  expect(new Set(learnedIds).size).toBe(INTENTS);

  expect(stored).toHaveLength(INTENTS);
  expect(act.loans).toBe(INTENTS);
  const storedById = new Map(stored.map((loan) => [String(loan.id), loan]));
  for (const outcome of act.outcomes) {
    expect(storedById.get(String(outcome.loan?.id))).toMatchObject(outcome.intent);
  }
}

describe('lossy network: 1,000 intents, 50 tasks, 30 % dropped responses, 10 % refused connections', () => {
  it('SQLite: exactly one loan per intent, each task learns its own', { timeout: 40_000 }, async () => {
    await proveExactlyOnce('SQLite', {});
  });

  it('without keys the same run creates duplicate loans', { timeout: 40_000 }, async () => {
    const { act, stored } = await lossyRun('SQLite', {}, false);
    const perIntent = new Set(stored.map((loan) => loan.issuedAt));
    const duplicates = stored.length - perIntent.size;
    expect(act.answered).toBe(INTENTS);
    expect(perIntent.size).toBe(INTENTS);
    // Every dropped response was a loan made whose answer never arrived; its retry made another.
    expect(duplicates).toBe(act.drops);
    expect(duplicates).toBeGreaterThan(0);
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
    await proveExactlyOnce('PostgreSQL, WORKERS=2', { DATABASE_URL: url.toString(), WORKERS: '2' });
  });
});
