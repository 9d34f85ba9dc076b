import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { type CapturedResponse, createIdempotency, type Outcome } from '../core/adapter.js';
import type { IdempotencyEvent } from '../core/contract/index.js';
import type { IdempotencyOptions } from '../core/options/index.js';
import type { IdempotencyStore } from '../core/store.js';
import { postRequest } from './engine-request.js';

/** The store with `renew` answering false: its renewals are lost, as when the store was unreachable. */
function losingRenewals(store: IdempotencyStore): IdempotencyStore {
  return new Proxy(store, {
    get: (target, property, receiver) =>
      property === 'renew' ? async () => false : Reflect.get(target, property, receiver),
  });
}

/** The store as seen by a process that dies at `crash()`: from then on no call of it arrives. */
function crashable(store: IdempotencyStore) {
  let crashed = false;
  const view = new Proxy(store, {
    get: (target, property, receiver) => {
      const value = Reflect.get(target, property, receiver);
      return crashed && typeof value === 'function' ? () => new Promise(() => {}) : value;
    },
  });
  const crash = () => {
    crashed = true;
  };
  return { store: view, crash };
}

/**
 * Leases through the engine on a real store: a handler that outlives its lease keeps its claim by
 * renewing it, a crashed one frees the key within one lease, and a handler whose renewals were
 * lost anyway never answers as if its response were saved. Called by the store conformance suite,
 * so it runs on every store; `storeOf` gives the suite's shared store (keys and scopes are fresh).
 *
 * Timing: lease 300 ms, renewed every 100 ms; handlers of 0.9–1.5 s outlive it several times over.
 */
export function describeLeaseRenewal(storeOf: () => IdempotencyStore): void {
  describe('leases through the engine', () => {
    const LEASE_MS = 300;
    const TEST_TIMEOUT_MS = 15_000;

    function engine(store: IdempotencyStore, options: Partial<IdempotencyOptions<{ scope: string }>> = {}) {
      return createIdempotency<{ scope: string }>({
        lease: LEASE_MS,
        ...options,
        store,
        scope: (req) => req.scope,
      });
    }

    const requestFor = (scope: string, key: string) => postRequest(key, undefined, { raw: { scope } });

    /** A handler that counts its runs, takes `ms`, and answers 201 naming `label` and its run. */
    function slowHandler(label: string, ms: number) {
      const state = { runs: 0 };
      const run = async (): Promise<CapturedResponse> => {
        const n = ++state.runs;
        await sleep(ms);
        return {
          status: 201,
          headers: { 'content-type': 'application/json', location: `/loans/${label}-${n}` },
          body: Buffer.from(JSON.stringify({ by: label, run: n })),
          complete: true,
        };
      };
      return Object.assign(state, { run });
    }

    function answerOf(outcome: Outcome): { status: number; body: string; location?: string } {
      if (outcome.kind !== 'executed' && outcome.kind !== 'replayed') {
        throw new Error(`expected an answer, got ${JSON.stringify(outcome)}`);
      }
      const { status, headers, body } = outcome.response;
      return { status, body: Buffer.from(body).toString(), location: headers.location };
    }

    function rejectionOf(outcome: Outcome) {
      if (outcome.kind !== 'rejected') throw new Error(`expected a rejection, got ${outcome.kind}`);
      return outcome.error;
    }

    const fresh = () => ({ scope: `scope-${randomUUID()}`, key: `key-${randomUUID()}` });
    const after = <T>(ms: number, fn: () => Promise<T>) => sleep(ms).then(fn);

    it(
      'a handler that outlives its lease runs once: duplicates at 0, 600 and 2,600 ms get one answer',
      async () => {
        const { scope, key } = fresh();
        const idem = engine(storeOf());
        const handler = slowHandler('only', 1500);
        const outcomes = await Promise.all(
          [0, 600, 2600].map((ms) => after(ms, () => idem.handle(requestFor(scope, key), handler.run))),
        );
        expect(handler.runs).toBe(1);
        expect(outcomes.map((o) => o.kind)).toEqual(['executed', 'replayed', 'replayed']);
        const answers = outcomes.map(answerOf);
        expect(answers[0]).toEqual({ status: 201, body: '{"by":"only","run":1}', location: '/loans/only-1' });
        expect(answers[1]).toEqual(answers[0]);
        expect(answers[2]).toEqual(answers[0]);
      },
      TEST_TIMEOUT_MS,
    );

    it(
      'a crashed owner frees the key within one lease of its last renewal',
      async () => {
        const { scope, key } = fresh();
        const owner = crashable(storeOf());
        let finish!: () => void;
        const hung = slowHandler('owner', 0);
        // Resolved at the end only so that the owner's engine stops renewing into the void.
        const stuck = new Promise<void>((resolve) => {
          finish = resolve;
        });
        void engine(owner.store).handle(requestFor(scope, key), () => stuck.then(hung.run));
        const other = engine(storeOf(), { concurrency: 'reject' });
        const retry = slowHandler('retry', 0);

        try {
          await sleep(2 * LEASE_MS);
          // Alive, the owner keeps its claim past its first lease.
          expect(rejectionOf(await other.handle(requestFor(scope, key), retry.run)).code).toBe(
            'request_in_progress',
          );
          owner.crash();
          await sleep(LEASE_MS * 1.5);
          expect(answerOf(await other.handle(requestFor(scope, key), retry.run)).status).toBe(201);
          expect(retry.runs).toBe(1);
        } finally {
          finish();
        }
      },
      TEST_TIMEOUT_MS,
    );

    describe('renewals lost anyway (store unreachable): the late completion stays fenced and is reported as `fenced`', () => {
      /**
       * The owner's renewals are lost; a retry through another engine takes the key over after the
       * lease (at 450 ms) and runs `taker`; the owner's handler finishes at 900 ms.
       */
      async function lostLease(taker: (label: string) => Promise<CapturedResponse>) {
        const { scope, key } = fresh();
        const events: IdempotencyEvent[] = [];
        const ownerHandler = slowHandler('owner', 900);
        const owner = engine(losingRenewals(storeOf()), { onEvent: (e) => events.push(e) }).handle(
          requestFor(scope, key),
          ownerHandler.run,
        );
        const retry = after(450, () =>
          engine(storeOf()).handle(requestFor(scope, key), () => taker('taker')),
        );
        const [ownerOutcome, retryOutcome] = await Promise.allSettled([owner, retry]);
        const later = await engine(storeOf()).handle(requestFor(scope, key), slowHandler('later', 0).run);
        expect(ownerHandler.runs).toBe(1);
        const expectReported = () => {
          expect(events.filter((e) => e.type === 'fenced')).toEqual([
            { type: 'fenced', key, scope, step: 'complete' },
          ]);
        };
        return { ownerOutcome, retryOutcome, later, expectReported };
      }

      const settled = <T>(result: PromiseSettledResult<T>): T => {
        if (result.status === 'rejected') throw result.reason;
        return result.value;
      };

      it(
        "the owner's client gets the winner's saved answer",
        async () => {
          const { ownerOutcome, retryOutcome, later, expectReported } = await lostLease(
            slowHandler('taker', 0).run,
          );
          const winner = answerOf(settled(retryOutcome));
          expect(winner.body).toBe('{"by":"taker","run":1}');
          expect(settled(ownerOutcome).kind).toBe('replayed');
          expect(answerOf(settled(ownerOutcome))).toEqual(winner);
          expect(answerOf(later)).toEqual(winner);
          expectReported();
        },
        TEST_TIMEOUT_MS,
      );

      it(
        "the owner's client gets 409 + Retry-After while the winner still runs",
        async () => {
          const { ownerOutcome, retryOutcome, later, expectReported } = await lostLease(
            slowHandler('taker', 1000).run,
          );
          const error = rejectionOf(settled(ownerOutcome));
          expect(error.status).toBe(409);
          expect(error.code).toBe('request_in_progress');
          expect(Number(error.headers['retry-after'])).toBeGreaterThanOrEqual(1);
          const winner = answerOf(settled(retryOutcome));
          expect(winner.body).toBe('{"by":"taker","run":1}');
          expect(answerOf(later)).toEqual(winner);
          expectReported();
        },
        TEST_TIMEOUT_MS,
      );

      it(
        "when the winner failed and saved nothing, the owner's answer is saved under a new claim and sent",
        async () => {
          const failure = new Error('taker failed');
          const { ownerOutcome, retryOutcome, later, expectReported } = await lostLease(async () => {
            throw failure;
          });
          expect(retryOutcome).toEqual({ status: 'rejected', reason: failure });
          const ownerAnswer = answerOf(settled(ownerOutcome));
          expect(settled(ownerOutcome).kind).toBe('executed');
          expect(ownerAnswer.body).toBe('{"by":"owner","run":1}');
          expect(later.kind).toBe('replayed');
          expect(answerOf(later)).toEqual(ownerAnswer);
          expectReported();
        },
        TEST_TIMEOUT_MS,
      );
    });
  });
}
