import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isTransactionEnded } from '../core/contract/index.js';
import {
  type AtomicResult,
  type AtomicStore,
  type AtomicWorkResult,
  type ClaimInput,
  type ClaimResult,
  type IdempotencyStore,
  isAtomicStore,
  isPhaseStore,
  type KeyRecordSummary,
  MAX_LIST_LIMIT,
  type PhaseStore,
  type SavedStep,
  type StoredResponse,
} from '../core/store.js';
import { describeLeaseRenewal } from './lease-suite.js';
import { expectWaitWokenBy } from './wait.js';

/**
 * The application's own writes, as seen by the atomic-mode tests: the suite cannot know an app's
 * tables, so the store's test file supplies one tiny table.
 */
export interface AtomicProbe<Tx = any> {
  /** Writes one row through `tx`, inside the atomic transaction. */
  write(tx: Tx): Promise<void> | void;
  /** Counts the committed rows, outside any transaction. */
  count(): Promise<number>;
  /**
   * Ends the atomic transaction as a handler's own raw `COMMIT` through `tx` would, for the stores
   * that detect it (`TransactionEndedError`).
   */
  commit?(tx: Tx): Promise<void> | void;
}

/** What a store's `setup` gives {@link describeStoreConformance}: the store and how to test it. */
export interface StoreUnderTest {
  store: IdempotencyStore;
  /** Runs after the suite has called `store.close()`: drop the schema, delete the keys, remove the file. */
  cleanup?: () => Promise<void>;
  /** For an AtomicStore: checks that the handler's own writes commit and roll back with the record. */
  atomicProbe?: AtomicProbe;
  /**
   * The backend deletes expired records by itself (Redis TTL), so `purgeExpired` may find nothing
   * left to count; the purge test then checks only that live records survive it.
   */
  expiresNatively?: boolean;
  /** `list` goes in the backend's scan order (Redis) rather than by scope, then key. */
  listsInScanOrder?: boolean;
}

/**
 * Opens the store under test before a suite's tests (handing it to `opened`) and, after them,
 * closes it and drops what it made.
 */
export function useStoreUnderTest(
  setup: () => Promise<StoreUnderTest>,
  opened: (subject: StoreUnderTest) => void,
): void {
  let subject: StoreUnderTest | undefined;
  beforeAll(async () => {
    subject = await setup();
    opened(subject);
  });
  afterAll(async () => {
    await subject?.store.close();
    await subject?.cleanup?.();
  });
}

/**
 * The contract every store passes (src/core/contract/store.ts), written once and run per store.
 *
 * The store from `setup` is shared by every test here; each test uses fresh random scopes and keys,
 * so a store backed by a shared database works, provided nothing else purges it or writes
 * expiring records to it while the suite runs (the purge test counts exactly what it deleted).
 *
 * Timing: leases and retention of 100-200 ms are waited out with sleeps of at least twice as long;
 * no test asserts how long anything took. `wait` is checked by ordering (it did not return before the
 * record changed) and by a test timeout far below the `timeoutMs` passed to it.
 *
 * Atomic mode (stores where `isAtomicStore` holds; the tests are skipped otherwise): a concurrent
 * duplicate of an atomic call either blocks until the first commits and then answers `replay`
 * (SQLite, PostgreSQL), or answers `in_progress`, in which case the caller `wait`s and calls
 * `atomic` again. Either way exactly one call answers `executed` and the work runs once.
 */
export function describeStoreConformance(name: string, setup: () => Promise<StoreUnderTest>): void {
  describe(`store conformance: ${name}`, () => {
    let subject: StoreUnderTest;
    let store: IdempotencyStore;
    useStoreUnderTest(setup, (opened) => {
      subject = opened;
      store = opened.store;
    });

    const LONG = { leaseMs: 30_000, retainMs: 60_000 };
    // Generous against the slowest store here; every sleep past a deadline is at least twice it.
    const SHORT_MS = 200;

    function fresh(fingerprint = 'fp-a', times: { leaseMs: number; retainMs: number } = LONG): ClaimInput {
      return { scope: `scope-${randomUUID()}`, key: `key-${randomUUID()}`, fingerprint, ...times };
    }

    function withFingerprint(input: ClaimInput, fingerprint: string): ClaimInput {
      return { ...input, fingerprint };
    }

    function sampleResponse(label = 'a'): StoredResponse {
      // Every byte value, then sequences that are not UTF-8 (lone continuation, truncated, overlong).
      const body = new Uint8Array([
        ...Array.from({ length: 256 }, (_, i) => i),
        0x80,
        0xc3,
        0x28,
        0xe2,
        0x82,
        0xf0,
        0xc0,
        0xaf,
        0,
        0,
        ...new TextEncoder().encode(label),
      ]);
      return {
        status: 201,
        headers: { 'content-type': 'application/octet-stream', location: `/things/${label}`, etag: '"é-1"' },
        body,
      };
    }

    async function acquire(input: ClaimInput): Promise<string> {
      const result = await store.claim(input);
      if (result.outcome !== 'acquired') throw new Error(`expected acquired, got ${JSON.stringify(result)}`);
      expect(typeof result.token).toBe('string');
      expect(result.token.length).toBeGreaterThan(0);
      return result.token;
    }

    function expectReplay(result: ClaimResult | AtomicResult, expected: StoredResponse): void {
      expect(result.outcome).toBe('replay');
      if (result.outcome !== 'replay') return;
      expect(result.response.status).toBe(expected.status);
      expect(result.response.headers).toEqual(expected.headers);
      expect(result.response.body).toBeInstanceOf(Uint8Array);
      expect(Array.from(result.response.body)).toEqual(Array.from(expected.body));
    }

    async function expectInProgress(input: ClaimInput): Promise<void> {
      const result = await store.claim(input);
      expect(result.outcome).toBe('in_progress');
      if (result.outcome === 'in_progress') {
        expect(result.retryAfterMs).toBeGreaterThan(0);
        expect(result.retryAfterMs).toBeLessThanOrEqual(input.leaseMs);
      }
    }

    describe('claim, complete, replay', () => {
      it('acquires a new key with a token', async () => {
        await acquire(fresh());
      });

      it('of 50 concurrent claims of one new key, exactly one acquires; the rest are in progress', async () => {
        const input = fresh();
        const results = await Promise.all(Array.from({ length: 50 }, () => store.claim(input)));
        expect(results.filter((r) => r.outcome === 'acquired')).toHaveLength(1);
        const others = results.filter((r) => r.outcome !== 'acquired');
        expect(others).toHaveLength(49);
        for (const result of others) {
          expect(result.outcome).toBe('in_progress');
          if (result.outcome === 'in_progress') {
            expect(result.retryAfterMs).toBeGreaterThan(0);
            expect(result.retryAfterMs).toBeLessThanOrEqual(input.leaseMs);
          }
        }
      });

      it('replays status, headers and binary body byte for byte, as often as asked', async () => {
        const input = fresh();
        const token = await acquire(input);
        const response = sampleResponse();
        expect(await store.complete(input.scope, input.key, token, response)).toBe(true);
        expectReplay(await store.claim(input), response);
        expectReplay(await store.claim(input), response);
      });

      it('replays an empty body with no headers', async () => {
        const input = fresh();
        const token = await acquire(input);
        const response = { status: 204, headers: {}, body: new Uint8Array(0) };
        expect(await store.complete(input.scope, input.key, token, response)).toBe(true);
        expectReplay(await store.claim(input), response);
      });

      it('answers mismatch to another fingerprint, in progress and completed, and keeps the record', async () => {
        const input = fresh('fp-a');
        const token = await acquire(input);
        expect(await store.claim(withFingerprint(input, 'fp-b'))).toEqual({ outcome: 'mismatch' });
        await expectInProgress(input);
        const response = sampleResponse();
        expect(await store.complete(input.scope, input.key, token, response)).toBe(true);
        expect(await store.claim(withFingerprint(input, 'fp-b'))).toEqual({ outcome: 'mismatch' });
        expectReplay(await store.claim(input), response);
      });

      it('keeps scopes apart: one key in two scopes names two operations', async () => {
        const first = fresh();
        const second = { ...first, scope: `scope-${randomUUID()}` };
        const firstToken = await acquire(first);
        const secondToken = await acquire(second);
        expect(secondToken).not.toBe(firstToken);
        expect(await store.complete(first.scope, first.key, firstToken, sampleResponse('first'))).toBe(true);
        await expectInProgress(second);
        expect(await store.complete(second.scope, second.key, secondToken, sampleResponse('second'))).toBe(
          true,
        );
        expectReplay(await store.claim(first), sampleResponse('first'));
        expectReplay(await store.claim(second), sampleResponse('second'));
      });

      it('release lets the next claim acquire with a new token', async () => {
        const input = fresh();
        const token = await acquire(input);
        expect(await store.release(input.scope, input.key, token)).toBe(true);
        const next = await acquire(input);
        expect(next).not.toBe(token);
        expect(await store.release(input.scope, input.key, token)).toBe(false);
        await expectInProgress(input);
      });

      it('a released key may be claimed with another fingerprint', async () => {
        const input = fresh('fp-a');
        const token = await acquire(input);
        expect(await store.release(input.scope, input.key, token)).toBe(true);
        await acquire(withFingerprint(input, 'fp-b'));
      });
    });

    describe('owner-token fencing', () => {
      it('complete and release with a wrong token answer false and change nothing', async () => {
        const input = fresh();
        const token = await acquire(input);
        expect(await store.complete(input.scope, input.key, `${token}-not`, sampleResponse('intruder'))).toBe(
          false,
        );
        expect(await store.release(input.scope, input.key, 'not-a-token')).toBe(false);
        await expectInProgress(input);
        expect(await store.complete(input.scope, input.key, token, sampleResponse('owner'))).toBe(true);
        expectReplay(await store.claim(input), sampleResponse('owner'));
      });

      it('complete and release of an absent key answer false', async () => {
        const input = fresh();
        expect(await store.complete(input.scope, input.key, 'token', sampleResponse())).toBe(false);
        expect(await store.release(input.scope, input.key, 'token')).toBe(false);
        await acquire(input);
      });

      it('a completed record cannot be completed again or released', async () => {
        const input = fresh();
        const token = await acquire(input);
        expect(await store.complete(input.scope, input.key, token, sampleResponse('first'))).toBe(true);
        expect(await store.complete(input.scope, input.key, token, sampleResponse('second'))).toBe(false);
        expect(await store.release(input.scope, input.key, token)).toBe(false);
        expectReplay(await store.claim(input), sampleResponse('first'));
      });

      it('after the lease passes a retry takes over with a new token; the old owner can no longer write', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        const oldToken = await acquire(input);
        await sleep(SHORT_MS * 2);
        const newToken = await acquire(input);
        expect(newToken).not.toBe(oldToken);
        expect(await store.complete(input.scope, input.key, oldToken, sampleResponse('old'))).toBe(false);
        expect(await store.release(input.scope, input.key, oldToken)).toBe(false);
        await expectInProgress(input);
        expect(await store.complete(input.scope, input.key, newToken, sampleResponse('new'))).toBe(true);
        expect(await store.complete(input.scope, input.key, oldToken, sampleResponse('old'))).toBe(false);
        expectReplay(await store.claim(input), sampleResponse('new'));
      });

      it('a passed lease is not taken over by another fingerprint', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        await acquire(input);
        await sleep(SHORT_MS * 2);
        expect(await store.claim(withFingerprint(input, 'fp-b'))).toEqual({ outcome: 'mismatch' });
      });

      it('an owner whose lease passed but was not taken over still completes', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        const token = await acquire(input);
        await sleep(SHORT_MS * 2);
        expect(await store.complete(input.scope, input.key, token, sampleResponse('late'))).toBe(true);
        expectReplay(await store.claim(input), sampleResponse('late'));
      });
    });

    describe('renew', () => {
      it('extends the lease of its owner: a competing claim stays in progress past the old lease', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        const token = await acquire(input);
        expect(await store.renew(input.scope, input.key, token, 60_000)).toBe(true);
        await sleep(SHORT_MS * 2);
        expect((await store.claim(input)).outcome).toBe('in_progress');
        expect(await store.renew(input.scope, input.key, token, SHORT_MS)).toBe(true);
        await sleep(SHORT_MS * 2);
        const next = await acquire(input);
        expect(next).not.toBe(token);
      });

      it('a lease renewed past retention keeps the record in progress; purge spares it', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS / 2, retainMs: SHORT_MS });
        const token = await acquire(input);
        expect(await store.renew(input.scope, input.key, token, 60_000)).toBe(true);
        await sleep(SHORT_MS * 2);
        expect((await store.claim(input)).outcome).toBe('in_progress');
        await store.purgeExpired();
        expect((await store.claim(input)).outcome).toBe('in_progress');
        expect(await store.complete(input.scope, input.key, token, sampleResponse())).toBe(true);
        expectReplay(await store.claim(input), sampleResponse());
      });

      it('with a stale or wrong token answers false and changes nothing', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        const oldToken = await acquire(input);
        expect(await store.renew(input.scope, input.key, `${oldToken}-not`, 60_000)).toBe(false);
        await sleep(SHORT_MS * 2);
        const newToken = await acquire(input);
        expect(await store.renew(input.scope, input.key, oldToken, 60_000)).toBe(false);
        await expectInProgress(input);
        await sleep(SHORT_MS * 2);
        await acquire(input);
        expect(await store.complete(input.scope, input.key, newToken, sampleResponse())).toBe(false);
      });

      it('after completion or release, and of an absent key, answers false', async () => {
        const completed = fresh();
        const token = await acquire(completed);
        expect(await store.complete(completed.scope, completed.key, token, sampleResponse())).toBe(true);
        expect(await store.renew(completed.scope, completed.key, token, 60_000)).toBe(false);
        expectReplay(await store.claim(completed), sampleResponse());

        const released = fresh();
        const releasedToken = await acquire(released);
        expect(await store.release(released.scope, released.key, releasedToken)).toBe(true);
        expect(await store.renew(released.scope, released.key, releasedToken, 60_000)).toBe(false);
        await acquire(released);

        const absent = fresh();
        expect(await store.renew(absent.scope, absent.key, 'token', 60_000)).toBe(false);
        await acquire(absent);
      });
    });

    describeLeaseRenewal(() => store);

    describe('wait', () => {
      // Far beyond the test timeout: a wait that only returns at its timeout fails the test.
      const NEVER_MS = 120_000;
      const TEST_TIMEOUT_MS = 15_000;

      async function expectWokenBy(change: (input: ClaimInput, token: string) => Promise<unknown>) {
        const input = fresh();
        const token = await acquire(input);
        await expectWaitWokenBy(store, input.scope, input.key, () => change(input, token), {
          settleMs: SHORT_MS,
          timeoutMs: NEVER_MS,
        });
      }

      it(
        'resolves when the record completes',
        async () => {
          await expectWokenBy((input, token) =>
            store.complete(input.scope, input.key, token, sampleResponse()),
          );
        },
        TEST_TIMEOUT_MS,
      );

      it(
        'resolves when the record is released',
        async () => {
          await expectWokenBy((input, token) => store.release(input.scope, input.key, token));
        },
        TEST_TIMEOUT_MS,
      );

      it(
        'resolves when the lease passes',
        async () => {
          const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
          await acquire(input);
          await store.wait(input.scope, input.key, NEVER_MS);
          await acquire(input);
        },
        TEST_TIMEOUT_MS,
      );

      it(
        'resolves at once for an absent or completed key',
        async () => {
          const input = fresh();
          await store.wait(input.scope, input.key, NEVER_MS);
          const token = await acquire(input);
          await store.complete(input.scope, input.key, token, sampleResponse());
          await store.wait(input.scope, input.key, NEVER_MS);
        },
        TEST_TIMEOUT_MS,
      );

      it('returns after timeoutMs when nothing happens, leaving the record in progress', async () => {
        const input = fresh();
        await acquire(input);
        await store.wait(input.scope, input.key, SHORT_MS);
        await expectInProgress(input);
      });
    });

    describe('retention and purge', () => {
      it('once retention passes the key names a new operation', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS / 2, retainMs: SHORT_MS });
        const token = await acquire(input);
        expect(await store.complete(input.scope, input.key, token, sampleResponse())).toBe(true);
        const abandoned = fresh('fp-a', { leaseMs: SHORT_MS / 2, retainMs: SHORT_MS });
        await acquire(abandoned);
        await sleep(SHORT_MS * 2);
        const again = await acquire({ ...input, ...LONG });
        await acquire(withFingerprint(abandoned, 'fp-b'));
        // The new operation is wholly new: its owner saves its own answer, which replays.
        expect((await store.get(input.scope, input.key))?.state).toBe('in_progress');
        expect(await store.complete(input.scope, input.key, again, sampleResponse('b'))).toBe(true);
        expectReplay(await store.claim(input), sampleResponse('b'));
      });

      it("a record lives for the claim's retainMs, not its lease", async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS / 2, retainMs: 60_000 });
        await acquire(input);
        await sleep(SHORT_MS * 2);
        const record = await store.get(input.scope, input.key);
        expect(record!.expiresAtMs - record!.createdAtMs).toBeCloseTo(60_000, -3);
        await store.purgeExpired();
        expect((await store.get(input.scope, input.key))?.state).toBe('in_progress');
      });

      it('purgeExpired deletes expired records in batches and keeps live ones', async () => {
        // Longer than SHORT_MS: creating eleven records takes a while on a loaded machine, and
        // none may expire before the last one exists.
        const expiring = { leaseMs: SHORT_MS * 2, retainMs: SHORT_MS * 5 };
        await store.purgeExpired();
        const expiredCompleted = Array.from({ length: 7 }, () => fresh('fp-a', expiring));
        for (const input of expiredCompleted) {
          expect(await store.complete(input.scope, input.key, await acquire(input), sampleResponse())).toBe(
            true,
          );
        }
        const expiredAbandoned = Array.from({ length: 2 }, () => fresh('fp-a', expiring));
        for (const input of expiredAbandoned) await acquire(input);
        const liveCompleted = fresh();
        expect(
          await store.complete(
            liveCompleted.scope,
            liveCompleted.key,
            await acquire(liveCompleted),
            sampleResponse(),
          ),
        ).toBe(true);
        const liveInProgress = fresh();
        await acquire(liveInProgress);
        const liveLease = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: SHORT_MS });
        expect(await store.renew(liveLease.scope, liveLease.key, await acquire(liveLease), 60_000)).toBe(
          true,
        );
        await sleep(SHORT_MS * 6);

        const deleted = await store.purgeExpired(3);
        if (subject.expiresNatively) {
          expect(deleted).toBeGreaterThanOrEqual(0);
        } else {
          expect(deleted).toBe(expiredCompleted.length + expiredAbandoned.length);
          expect(await store.purgeExpired(3)).toBe(0);
        }
        expectReplay(await store.claim(liveCompleted), sampleResponse());
        await expectInProgress(liveInProgress);
        await expectInProgress({ ...liveLease, leaseMs: 60_000 });
        for (const input of [...expiredCompleted, ...expiredAbandoned]) await acquire(input);
      });
    });

    describe('admin: list, get, delete', () => {
      const SUMMARY_FIELDS = [
        'createdAtMs',
        'expiresAtMs',
        'key',
        'leaseUntilMs',
        'scope',
        'state',
        'status',
      ];

      async function completed(input: ClaimInput, status = 201): Promise<void> {
        const token = await acquire(input);
        expect(await store.complete(input.scope, input.key, token, { ...sampleResponse(), status })).toBe(
          true,
        );
      }

      /** Every page of a listing, `limit` at a time, until `next` is null (at most 1000 pages). */
      async function listAll(options: { scope?: string; limit: number }): Promise<KeyRecordSummary[]> {
        const records: KeyRecordSummary[] = [];
        let after: string | undefined;
        for (let page = 0; page < 1000; page++) {
          const result = await store.list({ ...options, after });
          expect(result.records.length).toBeLessThanOrEqual(options.limit);
          records.push(...result.records);
          if (result.next === null) return records;
          after = result.next;
        }
        throw new Error('the listing did not end within 1000 pages');
      }

      it('get shows an in-progress record, then its completion, and nothing of its request or response', async () => {
        const beforeMs = Date.now();
        const input = fresh();
        const token = await acquire(input);
        const inProgress = await store.get(input.scope, input.key);
        expect(Object.keys(inProgress ?? {}).sort()).toEqual(SUMMARY_FIELDS);
        expect(inProgress).toMatchObject({
          scope: input.scope,
          key: input.key,
          state: 'in_progress',
          status: null,
        });
        // Stores on a database server take times from its clock, which may be a little off ours.
        expect(inProgress!.createdAtMs).toBeGreaterThan(beforeMs - 5000);
        expect(inProgress!.leaseUntilMs! - inProgress!.createdAtMs).toBeCloseTo(input.leaseMs, -3);
        expect(inProgress!.expiresAtMs - inProgress!.createdAtMs).toBeCloseTo(input.retainMs, -3);

        expect(
          await store.complete(input.scope, input.key, token, { ...sampleResponse(), status: 202 }),
        ).toBe(true);
        const done = await store.get(input.scope, input.key);
        expect(done).toMatchObject({ state: 'completed', status: 202, leaseUntilMs: null });
        expect(done!.expiresAtMs).toBe(inProgress!.expiresAtMs);
        expect(await store.get(input.scope, `${input.key}-other`)).toBeUndefined();
        expect(await store.get(`${input.scope}-other`, input.key)).toBeUndefined();
      });

      it('get reads the same times each time it is asked: they are stored, not recomputed from a clock', async () => {
        // Redis derived them from TIME plus the key's TTL, each read at a different instant, so
        // one read in a few dozen came out 1 ms off (a takeover's kept createdAt, flaky in CI).
        const input = fresh();
        await acquire(input);
        const reads = await Promise.all(Array.from({ length: 500 }, () => store.get(input.scope, input.key)));
        const times = new Set(
          reads.map((read) => `${read?.createdAtMs} ${read?.leaseUntilMs} ${read?.expiresAtMs}`),
        );
        expect([...times]).toHaveLength(1);
      });

      it("get with { response: true } shows a completed record's saved response byte for byte, and none while in progress", async () => {
        const input = fresh();
        const token = await acquire(input);
        const inProgress = await store.get(input.scope, input.key, { response: true });
        expect(inProgress).toMatchObject({ state: 'in_progress' });
        expect(inProgress).not.toHaveProperty('response');

        const saved = { ...sampleResponse('shown'), status: 202 };
        expect(await store.complete(input.scope, input.key, token, saved)).toBe(true);
        const shown = await store.get(input.scope, input.key, { response: true });
        expect(shown).toMatchObject({ state: 'completed', status: 202 });
        expect(shown!.response!.status).toBe(202);
        expect(shown!.response!.headers).toEqual(saved.headers);
        expect(shown!.response!.body).toBeInstanceOf(Uint8Array);
        expect(Array.from(shown!.response!.body)).toEqual(Array.from(saved.body));
        // Without the option a record is its summary only.
        expect(Object.keys((await store.get(input.scope, input.key)) ?? {}).sort()).toEqual(SUMMARY_FIELDS);
        expect(await store.get(input.scope, `${input.key}-other`, { response: true })).toBeUndefined();
      });

      it('lists one scope page by page: every record once, no other scope, pages within the limit', async () => {
        const scope = `scope-${randomUUID()}`;
        const keys = Array.from({ length: 7 }, (_, i) => `key-${i}-${randomUUID()}`);
        for (const [i, key] of keys.entries()) {
          const input = { ...fresh(), scope, key };
          if (i % 2 === 0) await completed(input, 200 + i);
          else await acquire(input);
        }
        await acquire({ ...fresh(), scope: `${scope}-other` });
        await acquire({ ...fresh(), scope: scope.slice(0, -1) });

        const listed = await listAll({ scope, limit: 2 });
        expect(listed.map((record) => record.key).sort()).toEqual([...keys].sort());
        if (!subject.listsInScanOrder) expect(listed.map((record) => record.key)).toEqual([...keys].sort());
        for (const record of listed) {
          expect(record.scope).toBe(scope);
          const i = keys.indexOf(record.key);
          expect(record).toMatchObject(
            i % 2 === 0 ? { state: 'completed', status: 200 + i } : { state: 'in_progress', status: null },
          );
        }
      });

      it('lists every scope when none is given, in order across scopes', async () => {
        const mine = [fresh(), fresh(), fresh()];
        for (const input of mine) await acquire(input);
        const listed = await listAll({ limit: 50 });
        const ids = listed.map((record) => JSON.stringify([record.scope, record.key]));
        for (const input of mine) expect(ids).toContain(JSON.stringify([input.scope, input.key]));
        expect(new Set(ids).size).toBe(ids.length);
        if (!subject.listsInScanOrder) {
          // Only these: other tests' scopes hold characters that collations order differently.
          const listedMine = ids.filter((id) => mine.some((input) => id.includes(input.scope)));
          expect(listedMine).toEqual(mine.map((input) => JSON.stringify([input.scope, input.key])).sort());
        }
      });

      it('neither lists nor gets a record whose retention has passed', async () => {
        const scope = `scope-${randomUUID()}`;
        const expiring = { ...fresh('fp-a', { leaseMs: SHORT_MS / 2, retainMs: SHORT_MS }), scope };
        const live = { ...fresh(), scope };
        await completed(expiring);
        await acquire(live);
        await sleep(SHORT_MS * 2);
        expect(await store.get(expiring.scope, expiring.key)).toBeUndefined();
        expect((await listAll({ scope, limit: 10 })).map((record) => record.key)).toEqual([live.key]);
        expect(await store.delete(expiring.scope, expiring.key)).toBe(false);
      });

      it('delete removes a completed record: the key then names a new operation', async () => {
        const input = fresh();
        await completed(input);
        expect(await store.delete(input.scope, input.key)).toBe(true);
        expect(await store.get(input.scope, input.key)).toBeUndefined();
        expect(await store.delete(input.scope, input.key)).toBe(false);
        await acquire(withFingerprint(input, 'fp-b'));
      });

      it('delete removes an in-progress record and fences its owner out', async () => {
        const input = fresh();
        const token = await acquire(input);
        expect(await store.delete(input.scope, input.key)).toBe(true);
        const next = await acquire(input);
        expect(await store.complete(input.scope, input.key, token, sampleResponse('old'))).toBe(false);
        expect(await store.complete(input.scope, input.key, next, sampleResponse('new'))).toBe(true);
        expectReplay(await store.claim(input), sampleResponse('new'));
      });

      it('delete of one scope leaves the same key in another scope alone', async () => {
        const first = fresh();
        const second = { ...first, scope: `scope-${randomUUID()}` };
        await completed(first);
        await completed(second);
        expect(await store.delete(first.scope, first.key)).toBe(true);
        expect(await store.get(second.scope, second.key)).toMatchObject({ state: 'completed' });
      });

      it('delete wakes a wait on the record', async () => {
        const input = fresh();
        await acquire(input);
        await expectWaitWokenBy(
          store,
          input.scope,
          input.key,
          async () => expect(await store.delete(input.scope, input.key)).toBe(true),
          { settleMs: SHORT_MS },
        );
      }, 15_000);

      it('rejects a bad limit or a cursor it did not make', async () => {
        await expect(store.list({ limit: 0 })).rejects.toThrow(/limit/);
        await expect(store.list({ limit: MAX_LIST_LIMIT + 1 })).rejects.toThrow(/limit/);
        await expect(store.list({ limit: 1.5 })).rejects.toThrow(/limit/);
        await expect(store.list({ after: 'not a cursor' })).rejects.toThrow(/after/);
        const forged = Buffer.from(JSON.stringify([1, 2])).toString('base64url');
        await expect(store.list({ after: forged })).rejects.toThrow(/after/);
      });
    });

    describe('properties', () => {
      const scopeArb = fc.string({ unit: 'binary', maxLength: 40 }).filter((s) => !s.includes('\u0000'));
      const keyArb = fc.string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 255 });
      const responseArb = fc.record({
        status: fc.integer({ min: 100, max: 599 }),
        headers: fc.dictionary(
          fc.stringMatching(/^[a-z][a-z0-9-]{0,20}$/),
          fc.string({ unit: 'grapheme-ascii', maxLength: 60 }),
          { maxKeys: 6 },
        ),
        body: fc.uint8Array({ maxLength: 4096 }),
      });

      it('any scope, key and response round-trip through claim, complete and replay', async () => {
        await fc.assert(
          fc.asyncProperty(scopeArb, keyArb, responseArb, async (scope, key, response) => {
            const input = { ...fresh(), scope: `${randomUUID()}${scope}`, key };
            const token = await acquire(input);
            expect(await store.complete(input.scope, input.key, token, response)).toBe(true);
            expectReplay(await store.claim(input), response);
          }),
          { numRuns: 60 },
        );
      });

      it('distinct (scope, key) pairs never share a record', async () => {
        await fc.assert(
          fc.asyncProperty(
            fc.tuple(scopeArb, keyArb),
            fc.tuple(scopeArb, keyArb),
            async ([scopeA, keyA], [scopeB, keyB]) => {
              fc.pre(scopeA !== scopeB || keyA !== keyB);
              const nonce = randomUUID();
              const a = { ...fresh('fp-a'), scope: `${nonce}${scopeA}`, key: keyA };
              const b = { ...fresh('fp-b'), scope: `${nonce}${scopeB}`, key: keyB };
              await acquire(a);
              await acquire(b);
            },
          ),
          { numRuns: 60 },
        );
      });
    });

    describe('steps', () => {
      // Opaque to the store: quotes, backslashes, newlines and non-ASCII must come back unchanged.
      const awkward = '{"a":"line\\nbreak","q":"\\"","u":"é€😀"}\n\\ {}';
      const step = (name: string, value = `"${name}-result"`) => ({ name, value });

      async function takeOver(input: ClaimInput): Promise<Extract<ClaimResult, { outcome: 'acquired' }>> {
        await sleep(SHORT_MS * 2);
        const result = await store.claim(input);
        if (result.outcome !== 'acquired')
          throw new Error(`expected acquired, got ${JSON.stringify(result)}`);
        return result;
      }

      it('a takeover gets every saved step back, in order, values unchanged; get lists their names', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        const token = await acquire(input);
        expect(await store.saveStep(input.scope, input.key, token, step('recorded'), 'the request')).toBe(
          true,
        );
        expect(await store.saveStep(input.scope, input.key, token, step('charged', awkward))).toBe(true);
        expect((await store.get(input.scope, input.key))?.steps).toEqual(['recorded', 'charged']);
        const taken = await takeOver(input);
        expect(taken.steps).toEqual([step('recorded'), step('charged', awkward)]);
        expect(await store.saveStep(input.scope, input.key, taken.token, step('paid'))).toBe(true);
        expect(await store.complete(input.scope, input.key, taken.token, sampleResponse())).toBe(true);
        expectReplay(await store.claim(input), sampleResponse());
      });

      it("a stale owner's step save is refused and changes nothing; so is a wrong token's", async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        const oldToken = await acquire(input);
        expect(await store.saveStep(input.scope, input.key, `${oldToken}-not`, step('intruder'))).toBe(false);
        expect(await store.saveStep(input.scope, input.key, oldToken, step('recorded'), 'request')).toBe(
          true,
        );
        const taken = await takeOver(input);
        expect(await store.saveStep(input.scope, input.key, oldToken, step('charged'))).toBe(false);
        expect((await store.get(input.scope, input.key))?.steps).toEqual(['recorded']);
        expect(await store.saveStep(input.scope, input.key, taken.token, step('charged'))).toBe(true);
        expect(await store.complete(input.scope, input.key, taken.token, sampleResponse())).toBe(true);
        expect(await store.saveStep(input.scope, input.key, taken.token, step('late'))).toBe(false);
        const absent = fresh();
        expect(await store.saveStep(absent.scope, absent.key, 'token', step('x'))).toBe(false);
      });

      it("a takeover keeps the operation's createdAt and retention: they count from its first claim", async () => {
        // Issue 32: each takeover reset them, so an operation that kept failing was never purged.
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        const token = await acquire(input);
        expect(await store.saveStep(input.scope, input.key, token, step('recorded'), 'request')).toBe(true);
        const first = await store.get(input.scope, input.key);
        const taken = await takeOver(input);
        const after = await store.get(input.scope, input.key);
        expect(after?.createdAtMs).toBe(first!.createdAtMs);
        expect(after?.expiresAtMs).toBe(first!.expiresAtMs);
        // Past the first claim's retention, the takeover's key names a new operation after all.
        const short = fresh('fp-a', { leaseMs: SHORT_MS / 2, retainMs: SHORT_MS * 3 });
        await acquire(short);
        await sleep(SHORT_MS);
        const late = await store.claim(short);
        if (late.outcome !== 'acquired') throw new Error(`expected acquired, got ${JSON.stringify(late)}`);
        expect(await store.saveStep(short.scope, short.key, late.token, step('recorded'))).toBe(true);
        await sleep(SHORT_MS * 3);
        const again = await store.claim(short);
        expect(again.outcome === 'acquired' && (again.steps ?? [])).toEqual([]);
        expect(await store.complete(input.scope, input.key, taken.token, sampleResponse())).toBe(true);
      });

      it('a new operation on the key starts with no steps (released, or retention passed)', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: SHORT_MS });
        const token = await acquire(input);
        expect(await store.saveStep(input.scope, input.key, token, step('recorded'))).toBe(true);
        expect(await store.release(input.scope, input.key, token)).toBe(true);
        const again = await store.claim(input);
        expect(again.outcome === 'acquired' && (again.steps ?? [])).toEqual([]);
        if (again.outcome !== 'acquired') return;
        expect(await store.saveStep(input.scope, input.key, again.token, step('recorded'))).toBe(true);
        await sleep(SHORT_MS * 2);
        const fresher = await store.claim(input);
        expect(fresher.outcome === 'acquired' && (fresher.steps ?? [])).toEqual([]);
      });

      it('abandoned lists in-progress records whose lease passed and that saved a request, only those', async () => {
        const scope = `scope-${randomUUID()}`;
        const claimOf = (key: string, leaseMs: number) => ({
          scope,
          key,
          fingerprint: `fp-${key}`,
          leaseMs,
          retainMs: 60_000,
        });
        const dead = claimOf('dead', SHORT_MS);
        const live = claimOf('live', 30_000);
        const noRequest = claimOf('no-request', SHORT_MS);
        const done = claimOf('done', SHORT_MS);
        const tokens = await Promise.all([dead, live, noRequest, done].map(acquire));
        await store.saveStep(scope, 'dead', tokens[0]!, step('recorded'), 'request-dead');
        await store.saveStep(scope, 'live', tokens[1]!, step('recorded'), 'request-live');
        await store.saveStep(scope, 'no-request', tokens[2]!, step('recorded'));
        await store.saveStep(scope, 'done', tokens[3]!, step('recorded'), 'request-done');
        await store.complete(scope, 'done', tokens[3]!, sampleResponse());
        await sleep(SHORT_MS * 2);
        const mine = (await store.abandoned({ limit: MAX_LIST_LIMIT })).filter(
          (record) => record.scope === scope,
        );
        expect(mine.map(({ key, fingerprint, request }) => ({ key, fingerprint, request }))).toEqual([
          { key: 'dead', fingerprint: 'fp-dead', request: 'request-dead' },
        ]);
        expect(mine[0]!.leaseUntilMs).toBeLessThanOrEqual(Date.now() + 1000);
        await expect(store.abandoned({ limit: 0 })).rejects.toThrow(/limit/);
      });

      it('an owner letting go by ending its lease (renew to 1 ms) keeps the finished steps for the takeover', async () => {
        // How the engine releases an operation with finished steps: a release would delete them.
        const input = fresh();
        const token = await acquire(input);
        expect(await store.saveStep(input.scope, input.key, token, step('recorded'), 'request')).toBe(true);
        expect(await store.renew(input.scope, input.key, token, 1)).toBe(true);
        const taken = await takeOver(input);
        expect(taken.steps).toEqual([step('recorded')]);
        expect((await store.get(input.scope, input.key))?.steps).toEqual(['recorded']);
      });

      it('abandoned hands out the operation holding the key now, not one released before it', async () => {
        const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
        const first = await acquire(input);
        expect(await store.saveStep(input.scope, input.key, first, step('recorded'), 'request-a')).toBe(true);
        expect(await store.release(input.scope, input.key, first)).toBe(true);
        const second = await acquire(withFingerprint(input, 'fp-b'));
        expect(await store.saveStep(input.scope, input.key, second, step('recorded'), 'request-b')).toBe(
          true,
        );
        await sleep(SHORT_MS * 2);
        const mine = (await store.abandoned({ limit: MAX_LIST_LIMIT })).filter(
          (record) => record.scope === input.scope,
        );
        expect(mine.map(({ key, fingerprint, request }) => ({ key, fingerprint, request }))).toEqual([
          { key: input.key, fingerprint: 'fp-b', request: 'request-b' },
        ]);
      });

      describe('phases (SQL stores)', () => {
        let phased: PhaseStore;
        beforeAll(() => {
          if (isPhaseStore(store)) phased = store;
        });
        function skipUnlessPhased(context: { skip: (note?: string) => void }): void {
          if (!phased) context.skip('not a PhaseStore');
        }
        const count = () => subject.atomicProbe?.count() ?? Promise.resolve(0);

        it("commits the work's writes with the saved step; a stale owner's phase runs nothing", async (context) => {
          skipUnlessPhased(context);
          const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
          const token = await acquire(input);
          const before = await count();
          let runs = 0;
          const work = async (tx: unknown) => {
            runs++;
            await subject.atomicProbe?.write(tx);
            return step('recorded');
          };
          const written = subject.atomicProbe ? 1 : 0;
          expect(await phased.phase(input.scope, input.key, token, work, 'request')).toBe(true);
          expect(await count()).toBe(before + written);
          const taken = await takeOver(input);
          expect(taken.steps).toEqual([step('recorded')]);
          expect(await phased.phase(input.scope, input.key, token, work)).toBe(false);
          expect(runs).toBe(1);
          expect(await count()).toBe(before + written);
        });

        it('a phase that throws rolls its writes back and saves nothing', async (context) => {
          skipUnlessPhased(context);
          const input = fresh();
          const token = await acquire(input);
          const before = await count();
          const failing = async (tx: unknown): Promise<SavedStep> => {
            await subject.atomicProbe?.write(tx);
            throw new Error('provider said no');
          };
          await expect(phased.phase(input.scope, input.key, token, failing)).rejects.toThrow(
            'provider said no',
          );
          expect(await count()).toBe(before);
          expect((await store.get(input.scope, input.key))?.steps).toBeUndefined();
        });

        it('a takeover waits for an open phase and then gets its step', async (context) => {
          skipUnlessPhased(context);
          const input = fresh('fp-a', { leaseMs: SHORT_MS, retainMs: 60_000 });
          const token = await acquire(input);
          const order: string[] = [];
          let entered!: () => void;
          const inside = new Promise<void>((resolve) => (entered = resolve));
          let finish!: () => void;
          const finished = new Promise<void>((resolve) => (finish = resolve));
          const phase = phased.phase(input.scope, input.key, token, async (tx) => {
            await subject.atomicProbe?.write(tx);
            entered();
            await finished;
            order.push('phase done');
            return step('recorded');
          });
          await inside;
          await sleep(SHORT_MS * 2);
          // The lease has passed: the retry's claim blocks on the record until the phase commits.
          const claimed = store.claim(input).then((result) => {
            order.push('claimed');
            return result;
          });
          await sleep(SHORT_MS);
          finish();
          expect(await phase).toBe(true);
          const result = await claimed;
          expect(order).toEqual(['phase done', 'claimed']);
          expect(result.outcome === 'acquired' && result.steps).toEqual([step('recorded')]);
        });
      });
    });

    describe('atomic mode', () => {
      let atomic: AtomicStore;
      let probe: AtomicProbe | undefined;

      beforeAll(() => {
        if (isAtomicStore(store)) atomic = store;
        probe = subject.atomicProbe;
      });

      function skipUnlessAtomic(context: { skip: (note?: string) => void }): void {
        if (!atomic) context.skip('not an AtomicStore');
      }

      async function probeCount(): Promise<number> {
        return probe ? probe.count() : 0;
      }

      function countingWork(response: StoredResponse, commit = true) {
        const calls = { count: 0 };
        const work = async (tx: unknown): Promise<AtomicWorkResult> => {
          calls.count++;
          await probe?.write(tx);
          await sleep(10);
          return { response, commit };
        };
        return { calls, work };
      }

      it('commits the work, its writes and the response together; later calls replay', async (context) => {
        skipUnlessAtomic(context);
        const input = fresh();
        const before = await probeCount();
        const { calls, work } = countingWork(sampleResponse());
        const result = await atomic.atomic(input, work);
        expect(result.outcome).toBe('executed');
        if (result.outcome === 'executed') expect(result.committed).toBe(true);
        expect(await probeCount()).toBe(before + (probe ? 1 : 0));
        expectReplay(await atomic.claim(input), sampleResponse());
        expectReplay(await atomic.atomic(input, work), sampleResponse());
        expect(calls.count).toBe(1);
        expect(await atomic.atomic(withFingerprint(input, 'fp-b'), work)).toEqual({ outcome: 'mismatch' });
        expect(calls.count).toBe(1);
      });

      it('commit: false rolls back the work and the claim; the key is claimable again', async (context) => {
        skipUnlessAtomic(context);
        const input = fresh();
        const before = await probeCount();
        const { work } = countingWork({ status: 503, headers: {}, body: new Uint8Array([1]) }, false);
        const result = await atomic.atomic(input, work);
        expect(result).toMatchObject({ outcome: 'executed', committed: false });
        expect(await probeCount()).toBe(before);
        await acquire(input);
      });

      for (const ending of ['returns', 'throws', 'answers 5xx'] as const) {
        it(`a raw COMMIT in work, which then ${ending}, is caught: TransactionEndedError, and the key keeps a 500 no retry runs past`, async (context) => {
          skipUnlessAtomic(context);
          if (!probe?.commit) return context.skip('the probe cannot end the transaction');
          const input = fresh();
          const before = await probeCount();
          let runs = 0;
          const work = async (tx: unknown): Promise<AtomicWorkResult> => {
            runs++;
            await probe!.write(tx);
            await probe!.commit!(tx);
            if (ending === 'throws') throw new Error('after its own commit');
            return ending === 'returns'
              ? { response: sampleResponse(), commit: true }
              : { response: { status: 500, headers: {}, body: new Uint8Array() }, commit: false };
          };
          const failure = await atomic.atomic(input, work).catch((error: unknown) => error);
          expect(isTransactionEnded(failure)).toBe(true);
          expect((failure as Error).message).toMatch(/ended the operation's transaction itself/);
          expect(await probeCount()).toBe(before + 1);
          // Every retry, in either mode, replays the kept 500 and runs nothing, even past the lease.
          expect(await atomic.atomic(input, work)).toMatchObject({
            outcome: 'replay',
            response: { status: 500 },
          });
          expect(await atomic.claim({ ...input, leaseMs: 1 })).toMatchObject({ outcome: 'replay' });
          expect(runs).toBe(1);
          expect(await probeCount()).toBe(before + 1);
        });
      }

      it('work that throws rolls back and the error reaches the caller', async (context) => {
        skipUnlessAtomic(context);
        const input = fresh();
        const before = await probeCount();
        const failure = new Error('handler failed');
        await expect(
          atomic.atomic(input, async (tx) => {
            await probe?.write(tx);
            throw failure;
          }),
        ).rejects.toBe(failure);
        expect(await probeCount()).toBe(before);
        await acquire(input);
      });

      it('answers in_progress without running the work while a plain claim holds the key', async (context) => {
        skipUnlessAtomic(context);
        const input = fresh();
        await acquire(input);
        const { calls, work } = countingWork(sampleResponse());
        const result = await atomic.atomic(input, work);
        expect(result.outcome).toBe('in_progress');
        if (result.outcome === 'in_progress') expect(result.retryAfterMs).toBeGreaterThan(0);
        expect(calls.count).toBe(0);
      });

      it('of 20 concurrent atomic calls of one key, one executes and the others replay it', async (context) => {
        skipUnlessAtomic(context);
        const input = fresh();
        const before = await probeCount();
        const { calls, work } = countingWork(sampleResponse('once'));

        async function untilSettled(): Promise<AtomicResult> {
          for (let round = 0; round < 100; round++) {
            const result = await atomic.atomic(input, work);
            if (result.outcome !== 'in_progress') return result;
            await atomic.wait(input.scope, input.key, result.retryAfterMs);
          }
          throw new Error('still in progress after 100 rounds');
        }

        const results = await Promise.all(Array.from({ length: 20 }, untilSettled));
        const executed = results.filter((r) => r.outcome === 'executed');
        expect(executed).toHaveLength(1);
        expect(executed[0]).toMatchObject({ committed: true });
        for (const result of results.filter((r) => r.outcome !== 'executed')) {
          expectReplay(result, sampleResponse('once'));
        }
        expect(calls.count).toBe(1);
        expect(await probeCount()).toBe(before + (probe ? 1 : 0));
      });
    });
  });
}
