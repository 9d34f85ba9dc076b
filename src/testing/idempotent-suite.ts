import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import type { IdempotencyEvent } from '../core/contract/index.js';
import { type IdempotentOptions, idempotent } from '../core/jobs/index.js';
import { type IdempotencyStore, isAtomicStore } from '../core/store.js';
import { signal } from './signal.js';
import { type AtomicProbe, type StoreUnderTest, useStoreUnderTest } from './store-suite.js';

/** The code of what `promise` rejected with (it must reject). */
async function codeOf(promise: Promise<unknown>): Promise<string> {
  const error = await promise.then(
    () => {
      throw new Error('expected the run to throw');
    },
    (thrown: unknown) => thrown,
  );
  return (error as { code: string }).code;
}

/** Any JSON value, with -0 written as 0 (JSON gives 0 back) so results compare as values. */
const jsonValue = fc.jsonValue({ maxDepth: 4 }).map((value) => JSON.parse(JSON.stringify(value)) as unknown);

/** The same object with its members in reverse order: canonically the same input. */
function reordered(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reordered);
  if (typeof value !== 'object' || value === null) return value;
  return Object.fromEntries(
    Object.entries(value)
      .reverse()
      .map(([name, member]) => [name, reordered(member)]),
  );
}

/**
 * `idempotent(options)` on one store: what the issue promises of `run(input, work)`, in lease mode
 * and (on atomic stores) in atomic mode, where work's writes go through `ctx.tx`.
 * Leases of 150-200 ms are waited out with sleeps of at least twice as long; nothing is timed.
 */
export function describeIdempotentConformance(name: string, setup: () => Promise<StoreUnderTest>): void {
  describe(`idempotent(): ${name}`, () => {
    let subject: StoreUnderTest;
    let store: IdempotencyStore;
    useStoreUnderTest(setup, (opened) => {
      subject = opened;
      store = opened.store;
    });

    type Input = { id: string; data?: unknown; attempt?: number };
    const runner = (options: Partial<IdempotentOptions<Input>> = {}) =>
      idempotent<Input>({ store, key: (input) => input.id, scope: `s-${randomUUID()}`, ...options });
    const freshId = () => `job-${randomUUID()}`;

    /** A run of a fresh id held open for `heldMs`: another run of that id meanwhile is refused as in progress. */
    async function expectInProgressWhileHeld(run: ReturnType<typeof runner>, heldMs: number): Promise<void> {
      const id = freshId();
      const gate = signal();
      const first = run({ id }, () => gate.promise.then(() => 'done'));
      await sleep(heldMs);
      expect(await codeOf(run({ id }, () => 'twice'))).toBe('request_in_progress');
      gate.resolve();
      expect(await first).toBe('done');
    }

    it('runs work once per key and answers every later run with its saved JSON result', async () => {
      await fc.assert(
        fc.asyncProperty(jsonValue, jsonValue, async (data, result) => {
          const run = runner();
          const id = freshId();
          let runs = 0;
          const work = () => {
            runs += 1;
            return result;
          };
          expect(await run({ id, data }, work)).toEqual(result);
          // The same input with its members in another order is the same input.
          expect(await run({ data: reordered(data), id } as Input, work)).toEqual(result);
          expect(runs).toBe(1);
        }),
        { numRuns: 25 },
      );
    });

    it('refuses the key with another input (key_conflict) and does not run work', async () => {
      await fc.assert(
        fc.asyncProperty(jsonValue, jsonValue, async (first, second) => {
          fc.pre(JSON.stringify(reordered(first)) !== JSON.stringify(reordered(second)));
          const run = runner();
          const id = freshId();
          await run({ id, data: first }, () => 'first');
          let ran = false;
          const other = run({ id, data: second }, () => {
            ran = true;
          });
          expect(await codeOf(other)).toBe('key_conflict');
          expect(ran).toBe(false);
        }),
        { numRuns: 15 },
      );
    });

    it('fingerprints only the part `fingerprint` picks, so a redelivery with a new attempt count replays', async () => {
      const run = runner({ fingerprint: (input) => input.data });
      const id = freshId();
      expect(await run({ id, data: { n: 1 }, attempt: 1 }, () => 'sent')).toBe('sent');
      expect(await run({ id, data: { n: 1 }, attempt: 2 }, () => 'again')).toBe('sent');
      expect(await codeOf(run({ id, data: { n: 2 }, attempt: 3 }, () => 'other'))).toBe('key_conflict');
    });

    it('frees the key when work throws and rethrows its error; the next run runs again', async () => {
      const events: IdempotencyEvent[] = [];
      const run = runner({ onEvent: (event) => events.push(event) });
      const id = freshId();
      const failure = new Error('smtp down');
      await expect(
        run({ id }, () => {
          throw failure;
        }),
      ).rejects.toBe(failure);
      expect(await run({ id }, () => 'sent')).toBe('sent');
      expect(events.map((event) => event.type)).toEqual(['released', 'executed']);
    });

    it('saves an undefined result and gives it back', async () => {
      const run = runner();
      const id = freshId();
      let runs = 0;
      expect(await run({ id }, () => void runs++)).toBeUndefined();
      expect(await run({ id }, () => void runs++)).toBeUndefined();
      expect(runs).toBe(1);
    });

    it('runs concurrent runs of one key once: the others wait for its result', async () => {
      const run = runner();
      const id = freshId();
      const gate = signal();
      let runs = 0;
      const work = async () => {
        runs += 1;
        await gate.promise;
        return { receipt: runs };
      };
      const all = Promise.all(Array.from({ length: 6 }, () => run({ id }, work)));
      await sleep(100);
      gate.resolve();
      expect(await all).toEqual(Array.from({ length: 6 }, () => ({ receipt: 1 })));
      expect(runs).toBe(1);
    });

    it("answers request_in_progress to a concurrent run with concurrency 'reject', and past `wait`", async () => {
      for (const options of [{ concurrency: 'reject' as const }, { wait: 50 }]) {
        await expectInProgressWhileHeld(runner(options), 50);
      }
    });

    it('keeps a long work its lease (renewals), so no other run takes the key over', async () => {
      const events: IdempotencyEvent[] = [];
      const run = runner({ lease: 150, concurrency: 'reject', onEvent: (event) => events.push(event) });
      // Held for three leases.
      await expectInProgressWhileHeld(run, 450);
      expect(events.some((event) => event.type === 'lease_renewed')).toBe(true);
    });

    it('takes over the key of a crashed run within one lease and runs work', async () => {
      const scope = `s-${randomUUID()}`;
      const run = runner({ scope, lease: 150, fingerprint: (input) => input.data });
      // A run that claimed the key and died: the claim stays, nothing renews it.
      let fingerprint = '';
      await run({ id: freshId(), data: 1 }, (ctx) => {
        fingerprint = ctx.fingerprint;
      });
      const id = freshId();
      const crashed = await store.claim({ scope, key: id, fingerprint, leaseMs: 150, retainMs: 60_000 });
      expect(crashed.outcome).toBe('acquired');
      expect(await run({ id, data: 1 }, () => 'recovered')).toBe('recovered');
    });

    it('refuses an input that is not JSON before work runs (input_not_json)', async () => {
      const run = idempotent<unknown>({ store, key: () => freshId() });
      for (const input of [
        { at: new Date() },
        new Map(),
        { n: Number.NaN },
        { big: 1n },
        [1, undefined, 3],
        new Array(2),
      ]) {
        let ran = false;
        expect(
          await codeOf(
            run(input, () => {
              ran = true;
            }),
          ),
        ).toBe('input_not_json');
        expect(ran).toBe(false);
      }
    });

    it('fails loudly on a result that cannot be saved (result_not_storable) and frees the key', async () => {
      const run = runner({ maxResultBytes: 64 });
      for (const bad of [new Date(), { m: new Map() }, { n: Number.POSITIVE_INFINITY }, 'x'.repeat(65)]) {
        const id = freshId();
        expect(await codeOf(run({ id }, () => bad))).toBe('result_not_storable');
        expect(await run({ id }, () => 'fixed')).toBe('fixed');
      }
    });

    it('refuses a key that is not a storable name (idempotency_key_invalid)', async () => {
      const run = idempotent<string>({ store, key: (input) => input });
      for (const key of ['', 'a\u0000b', 'line\nbreak', 'é'.repeat(513)]) {
        expect(await codeOf(run(key, () => 'x'))).toBe('idempotency_key_invalid');
      }
      // Anything else is a key as it is: spaces, commas, quotes, non-ASCII.
      expect(await run(`"quoted", spaced 🎟 ${randomUUID()}`, () => 'ok')).toBe('ok');
    });

    it('keeps the same key in two scopes apart, and a key past its ttl names a new operation', async () => {
      const id = freshId();
      expect(await runner({ scope: 'a' })({ id }, () => 'a')).toBe('a');
      expect(await runner({ scope: 'b' })({ id }, () => 'b')).toBe('b');
      const short = runner({ ttl: 150 });
      const other = freshId();
      expect(await short({ id: other }, () => 1)).toBe(1);
      await sleep(400);
      expect(await short({ id: other }, () => 2)).toBe(2);
    });

    it('stores results encrypted with `encryptionKey` and replays them', async () => {
      const scope = `s-${randomUUID()}`;
      const run = runner({ scope, encryptionKey: randomBytes(32) });
      const id = freshId();
      let fingerprint = '';
      await run({ id }, (ctx) => {
        fingerprint = ctx.fingerprint;
        return { secret: 'card 4242' };
      });
      const stored = await store.claim({ scope, key: id, fingerprint, leaseMs: 1000, retainMs: 60_000 });
      expect(stored.outcome).toBe('replay');
      if (stored.outcome === 'replay')
        expect(Buffer.from(stored.response.body).toString()).not.toMatch(/4242/);
      expect(await run({ id }, () => 'again')).toEqual({ secret: 'card 4242' });
    });

    describe('atomic mode', () => {
      let probe: AtomicProbe;
      beforeAll(() => {
        if (subject.atomicProbe) probe = subject.atomicProbe;
      });
      const atomic = (options: Partial<IdempotentOptions<Input>> = {}) =>
        runner({ mode: 'atomic', ...options });

      it("commits work's writes through ctx.tx with its result, once per key", async (t) => {
        if (!isAtomicStore(store) || !subject.atomicProbe) return t.skip();
        const run = atomic();
        const id = freshId();
        const before = await probe.count();
        const work = async (ctx: { tx: unknown }) => {
          await probe.write(ctx.tx);
          return 'written';
        };
        expect(await Promise.all([run({ id }, work), run({ id }, work), run({ id }, work)])).toEqual([
          'written',
          'written',
          'written',
        ]);
        expect(await run({ id }, work)).toBe('written');
        expect(await probe.count()).toBe(before + 1);
      });

      it("rolls work's writes back when work throws or its result cannot be saved", async (t) => {
        if (!isAtomicStore(store) || !subject.atomicProbe) return t.skip();
        const run = atomic();
        const before = await probe.count();
        const id = freshId();
        const failure = new Error('boom');
        await expect(
          run({ id }, async (ctx) => {
            await probe.write(ctx.tx);
            throw failure;
          }),
        ).rejects.toBe(failure);
        const unsaveable = run({ id: freshId() }, async (ctx) => {
          await probe.write(ctx.tx);
          return new Map();
        });
        expect(await codeOf(unsaveable)).toBe('result_not_storable');
        expect(await probe.count()).toBe(before);
        expect(
          await run({ id }, async (ctx) => {
            await probe.write(ctx.tx);
            return 'second delivery';
          }),
        ).toBe('second delivery');
        expect(await probe.count()).toBe(before + 1);
      });
    });
  });
}
