import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'vitest';
import { createRetryingFetch } from '../../src/client/index.js';
import { type LoanDesk, listLoans } from './loan-desk.js';

/**
 * A steady flow of keyed loans through a loan desk while one of its dependencies goes away and
 * comes back, and what must hold of it: every answer that is not a loan is a JSON "retry with the
 * same key", nothing hangs, the desk stays up and recovers by itself, one loan per intent.
 */

/** Client loops sending intents one after another; modest, the machine has two cores. */
const CLIENTS = 6;
/** Answered loans before the fault is injected, so it lands on a desk in full flow. */
const WARM_UP_LOANS = 12;
/** The bound on one attempt: past it the attempt counts as a hang. */
export const HANG_BOUND_MS = 10_000;
/** How long the desk gets to lend again once the dependency is back. */
export const RECOVERY_BOUND_MS = 20_000;
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
  outcome: { status: number; text: string; retryAfter: string | null } | 'hung' | 'network';
}

export interface Intent {
  key: string;
  body: LoanBody;
  startMs: number;
  /** The answer the client ended with, or why it gave up. */
  final: { status: number; body: any; replayed: boolean } | { error: string };
}

/** The `error` code of a JSON error body, or what else the body is. */
export function errorCode(text: string): string {
  try {
    const code = JSON.parse(text)?.error;
    return typeof code === 'string' ? code : 'no error code';
  } catch {
    return 'not JSON';
  }
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
        const retryAfter = response.headers.get('retry-after');
        attempts.push({ startMs, endMs: Date.now(), outcome: { status: response.status, text, retryAfter } });
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
      intent.final = {
        status: response.status,
        body: errorCode(text) === 'not JSON' ? text : JSON.parse(text),
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
  // The first loan lent by an attempt that started once the dependency was back.
  const recoveredAtMs = flow.attempts
    .filter((a) => a.startMs >= upMs && typeof a.outcome !== 'string' && a.outcome.status === 201)
    .reduce((first, a) => Math.min(first, a.endMs), Number.POSITIVE_INFINITY);
  const answers = failures.map((r) => `${r.status} ${errorCode(r.text)}`);
  return {
    intents: flow.intents.length,
    attempts: flow.attempts.length,
    hung: flow.attempts.filter((a) => a.outcome === 'hung').length,
    networkErrors: flow.attempts.filter((a) => a.outcome === 'network').length,
    failuresByAnswer: Object.fromEntries(
      [...new Set(answers)].map((answer) => [answer, answers.filter((a) => a === answer).length]),
    ),
    failuresBeforeTheFault: failures.filter((r) => r.endMs < downMs).length,
    status503: failures.filter((r) => r.status === 503).length,
    outageMs: upMs - downMs,
    recoveryMs: recoveredAtMs - upMs,
    slowestAttemptMs: Math.max(...flow.attempts.map((a) => a.endMs - a.startMs)),
  };
}

/** The desk's process is alive and printed nothing of a crash or an unhandled handler error. */
export function expectDeskAlive(desk: LoanDesk): void {
  expect(() => process.kill(desk.pid, 0)).not.toThrow();
  expect(desk.output()).not.toMatch(/died|failed to start|uncaught|unhandled|handler failed/i);
}

/**
 * Runs the flow through `fault`, which takes the dependency away and resolves once it is back,
 * then checks: every attempt answered within the bound and without a dropped connection (a desk
 * process that died would drop them); every answer that was not a loan a JSON 503 with
 * `Retry-After` or an in-progress 409, none before the fault and at least one 503; a loan lent again within RECOVERY_BOUND_MS;
 * every intent ended with its 201 and exactly one loan. Prints and returns what it saw.
 */
export async function flowThroughFault(desk: LoanDesk, label: string, fault: () => Promise<void>) {
  const flow = startFlow(desk.baseUrl);
  let downMs: number;
  let upMs: number;
  try {
    await until(() => flow.loaned() >= WARM_UP_LOANS, 20_000, 'the warm-up');
    downMs = Date.now();
    await fault();
    upMs = Date.now();
    flow.probe();
    const loanedBefore = flow.loaned();
    await until(() => flow.loaned() >= loanedBefore + 2 * CLIENTS, RECOVERY_BOUND_MS, 'recovery');
  } finally {
    await flow.stop();
  }
  const seen = summarize(flow, downMs, upMs);
  console.log(`${label}:`, seen);

  for (const attempt of flow.attempts) {
    expect(attempt.outcome).not.toBe('hung');
    expect(attempt.outcome).not.toBe('network');
    if (typeof attempt.outcome === 'string' || attempt.outcome.status === 201) continue;
    expect(`${attempt.outcome.status} ${errorCode(attempt.outcome.text)}`).toMatch(TRANSIENT_ANSWER);
    // A 503 tells the client when to come back; no other 5xx is ever answered.
    if (attempt.outcome.status === 503) expect(attempt.outcome.retryAfter).toMatch(/^\d+$/);
  }
  expect(seen.failuresBeforeTheFault).toBe(0);
  expect(seen.status503).toBeGreaterThan(0);
  expect(seen.recoveryMs).toBeLessThanOrEqual(RECOVERY_BOUND_MS);
  expectDeskAlive(desk);

  for (const intent of flow.intents) {
    expect(intent.final, JSON.stringify(intent)).toMatchObject({ status: 201, body: intent.body });
  }
  const loans = await listLoans(desk.baseUrl);
  const loansOf = new Map<string, unknown[]>();
  for (const loan of loans)
    loansOf.set(String(loan.issuedAt), [...(loansOf.get(String(loan.issuedAt)) ?? []), loan.id]);
  expect([...loansOf].filter(([, ids]) => ids.length > 1)).toEqual([]);
  expect(loans).toHaveLength(flow.intents.length);
  // The loan each client was told about is the one that exists for its intent.
  for (const intent of flow.intents) {
    expect(loansOf.get(intent.body.issuedAt)).toEqual([(intent.final as { body: { id: number } }).body.id]);
  }
  return { intents: flow.intents, downMs, upMs, seen };
}
