import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRetryingFetch } from '../src/client/index.js';
import { type LoanDesk, listLoans, startLoanDesk } from './support/loan-desk.js';
import { errorCode } from './support/loan-flow.js';
import { hasPgBouncer, startPgBouncer } from './support/pgbouncer.js';
import {
  clusterClient,
  deleteClusterKeys,
  hasRedisCluster,
  REDIS_CLUSTER_NODES,
} from './support/redis-cluster.js';
import { dropSchemas, hasMysql, hasPostgres, mysqlDatabase, PG_URL, uniqueName } from './support/services.js';

/**
 * Two loan desks, as on two hosts: separate `WORKERS=2` instances on their own ports, sharing one
 * engine. Clients spread duplicates of each intent over both and retry on the other instance
 * when one fails them. Every engine a desk can run on plugs in as one row of ENGINES.
 */

interface Engine {
  name: string;
  /** False when its servers are unreachable here (a loud skip; CI=true fails instead). */
  available: boolean;
  /** Makes a fresh place on the engine; resolves with the desks' environment and its teardown. */
  open(): Promise<{ env: Record<string, string>; close(): Promise<void> }>;
}

/** A pgbouncer of its own in transaction pooling mode, the desks in a schema of their own behind it. */
async function behindPgBouncer(): ReturnType<Engine['open']> {
  const bouncer = await startPgBouncer({ poolSize: 8 });
  const schema = uniqueName('rs_hosts');
  const url = new URL(bouncer.url);
  url.searchParams.set('schema', schema);
  url.searchParams.set('pooling', 'transaction');
  return {
    env: { DATABASE_URL: url.toString() },
    async close() {
      await bouncer.stop();
      await dropSchemas(schema);
    },
  };
}

/** One row per engine the desk runs on: its keys and its loans there, in the desk's default mode. */
const ENGINES: Engine[] = [
  {
    name: 'PostgreSQL behind PgBouncer, atomic mode',
    available: hasPostgres && hasPgBouncer,
    open: behindPgBouncer,
  },
  {
    name: 'MariaDB, atomic mode',
    available: hasMysql,
    open: async () => {
      const database = await mysqlDatabase();
      return { env: { DATABASE_URL: database.url }, close: () => database.drop() };
    },
  },
  {
    name: 'Redis Cluster (keys) and PostgreSQL (loans), lease mode',
    available: hasRedisCluster && hasPostgres,
    open: async () => {
      const schema = uniqueName('rs_hosts');
      const prefix = `${uniqueName('rs_hosts')}:`;
      const keys = `redis+cluster://${REDIS_CLUSTER_NODES.slice(0, 3).join(',')}?prefix=${prefix}`;
      return {
        env: { DATABASE_URL: `${PG_URL}?schema=${schema}`, IDEMPOTENCY_STORE: keys },
        async close() {
          const cluster = clusterClient();
          await deleteClusterKeys(cluster, prefix);
          await cluster.quit();
          await dropSchemas(schema);
        },
      };
    },
  },
];

const KEYS = 20;
const REQUESTS = 200;
/** Requests in flight at once, over both instances. */
const CONCURRENCY = 40;
/** Answered requests before one instance is killed: well into the run, far from its end. */
const KILL_AFTER_ANSWERS = 50;
const DAY_MS = 86_400_000;

interface Answer {
  key: string;
  status: number;
  loanId: number | undefined;
  error?: string;
}

/**
 * REQUESTS requests over KEYS keys (every key's duplicates interleaved with the others'), request
 * `i` first to instance `i % 2`; a failed attempt (no connection, 503, in-progress 409) goes to
 * the other instance. `onAnswer` sees the running count of answered requests.
 */
async function sendOverBoth(
  desks: readonly LoanDesk[],
  phase: number,
  onAnswer: (answered: number) => void = () => {},
): Promise<{ answers: Answer[]; bodies: Map<string, { issuedAt: string }>; failedAttempts: string[] }> {
  const keys = Array.from({ length: KEYS }, (_, k) => `hosts-${phase}-${k}-${randomUUID()}`);
  const bodies = new Map(
    keys.map((key, k) => [
      key,
      {
        member: `U-${1001 + (k % 10)}`,
        isbn: `K-${String(1 + (k % 10)).padStart(2, '0')}`,
        issuedAt: new Date(Date.UTC(2040 + phase, 0, 1) + k * DAY_MS).toISOString().slice(0, 10),
      },
    ]),
  );
  const answers: Answer[] = [];
  /** Attempts that did not end in a loan: the connection's error, or the status and error code. */
  const failedAttempts: string[] = [];
  let next = 0;
  async function client(): Promise<void> {
    for (let i = next++; i < REQUESTS; i = next++) {
      const key = keys[i % KEYS]!;
      let attempt = 0;
      const retryingFetch = createRetryingFetch({
        maxAttempts: 50,
        deadlineMs: 30_000,
        attemptTimeoutMs: 10_000,
        baseDelayMs: 20,
        maxDelayMs: 200,
        onAttempt({ outcome }) {
          if (outcome.kind === 'error') failedAttempts.push(String(outcome.error));
          else if (outcome.status !== 201) failedAttempts.push(String(outcome.status));
        },
        async fetch(request, init) {
          const desk = desks[(i + attempt++) % desks.length]!;
          return fetch(`${desk.baseUrl}/loans`, {
            method: request.method,
            headers: request.headers,
            body: await request.text(),
            signal: init.signal,
          });
        },
      });
      try {
        const response = await retryingFetch('http://desk/loans', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(bodies.get(key)),
          idempotencyKey: key,
        });
        const text = await response.text();
        const loanId = response.status === 201 ? (JSON.parse(text) as { id: number }).id : undefined;
        answers.push({ key, status: response.status, loanId, error: loanId ? undefined : errorCode(text) });
      } catch (error) {
        answers.push({ key, status: 0, loanId: undefined, error: String(error) });
      }
      onAnswer(answers.length);
    }
  }
  await Promise.all(Array.from({ length: CONCURRENCY }, client));
  return { answers, bodies, failedAttempts };
}

/** Every request answered 201, each key with one loan id, and the desk holds exactly one loan per key. */
async function expectOneLoanPerKey(
  survivor: LoanDesk,
  { answers, bodies }: Awaited<ReturnType<typeof sendOverBoth>>,
): Promise<void> {
  expect(answers.filter((a) => a.status !== 201)).toEqual([]);
  expect(answers).toHaveLength(REQUESTS);
  const idsOf = new Map<string, Set<number>>();
  for (const { key, loanId } of answers) idsOf.set(key, (idsOf.get(key) ?? new Set()).add(loanId!));
  expect([...idsOf.values()].map((ids) => ids.size)).toEqual(Array(KEYS).fill(1));

  const dates = new Map([...bodies].map(([key, body]) => [body.issuedAt, key]));
  const loans = (await listLoans(survivor.baseUrl)).filter((loan) => dates.has(String(loan.issuedAt)));
  expect(loans).toHaveLength(KEYS);
  for (const loan of loans) {
    expect([...idsOf.get(dates.get(String(loan.issuedAt))!)!]).toEqual([loan.id]);
  }
}

for (const engine of ENGINES) {
  describe.skipIf(!engine.available)(`two loan desks × 2 workers on ${engine.name}`, () => {
    let place: Awaited<ReturnType<Engine['open']>>;
    let desks: LoanDesk[] = [];

    beforeAll(async () => {
      place = await engine.open();
      desks = await Promise.all([0, 1].map(() => startLoanDesk({ env: place.env, workers: 2 })));
    }, 60_000);

    afterAll(async () => {
      for (const desk of desks) await desk.stop();
      await place?.close();
    }, 60_000);

    it(`${REQUESTS} requests over ${KEYS} keys, spread over both instances: ${KEYS} loans`, async () => {
      await expectOneLoanPerKey(desks[1]!, await sendOverBoth(desks, 1));
    }, 60_000);

    it('one instance SIGKILLed (its whole process group) mid-run: clients retry on the other, still one loan per key', async () => {
      let killed: Promise<void> | undefined;
      const sent = await sendOverBoth(desks, 2, (answered) => {
        if (answered === KILL_AFTER_ANSWERS) killed = desks[0]!.kill9();
      });
      await killed;
      expect(killed).toBeDefined();
      console.log(`failed attempts retried on the other instance: ${sent.failedAttempts.length}`, [
        ...new Set(sent.failedAttempts),
      ]);
      // The kill landed mid-run: some attempts were cut off by it, and retried.
      expect(sent.failedAttempts.length).toBeGreaterThan(0);
      expect(await desks[0]!.exited()).toBe(null);
      await expectOneLoanPerKey(desks[1]!, sent);
    }, 60_000);
  });
}
