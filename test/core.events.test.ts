import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { type CapturedResponse, createIdempotency } from '../src/core/adapter.js';
import type { IdempotencyEvent, IdempotencyOptions } from '../src/core/index.js';
import type { AtomicStore, IdempotencyStore, StoredResponse } from '../src/core/store.js';
import { memoryStore } from '../src/stores/memory.js';
import { sqliteStore } from '../src/stores/sqlite/index.js';
import { postRequest } from '../src/testing/engine-request.js';
import { signal } from '../src/testing/signal.js';
import { closedAfterEach } from './support/open-stores.js';

/** Every event kind the engine reports, each from a request that causes it. */

const closing = closedAfterEach();
afterEach(() => {
  vi.restoreAllMocks();
});

type Options = Partial<IdempotencyOptions<unknown>>;

/** An engine whose events are collected in `events`. */
function engine(options: Options = {}) {
  const store = closing(options.store ?? memoryStore());
  const events: IdempotencyEvent[] = [];
  const idem = createIdempotency({
    scope: () => 'tenant',
    onEvent: (e) => events.push(e),
    ...options,
    store,
  });
  return { idem, events, types: () => events.map((e) => e.type) };
}

/** The store with some methods replaced. */
const withStore = (overrides: Partial<IdempotencyStore>, base = memoryStore()): IdempotencyStore => ({
  ...closing(base),
  ...overrides,
});

const answer =
  (status = 201, extra: Partial<CapturedResponse> = {}) =>
  async (): Promise<CapturedResponse> => ({
    status,
    headers: { 'content-type': 'application/json' },
    body: Buffer.from('{"id":1}'),
    complete: true,
    ...extra,
  });

/**
 * The first request of `key`, its handler running and held there until `finish()`: a duplicate
 * sent meanwhile meets the key in progress.
 */
async function heldOriginal(idem: ReturnType<typeof engine>['idem'], key: string) {
  const held = signal();
  let running = false;
  const original = idem.handle(postRequest(key), async () => {
    running = true;
    await held.promise;
    return answer()();
  });
  await vi.waitFor(() => expect(running).toBe(true));
  return { original, finish: held.resolve };
}

const numbers = { handlerMs: expect.any(Number), storeMs: expect.any(Number) };

describe('onEvent', () => {
  it('executed, then replayed, then conflict', async () => {
    const { idem, events } = engine();
    await idem.handle(postRequest('k'), async () => {
      await sleep(20);
      return answer()();
    });
    await idem.handle(postRequest('k'), answer());
    await idem.handle(postRequest('k', { isbn: 'K-02' }), answer());
    expect(events).toEqual([
      { type: 'executed', key: 'k', scope: 'tenant', status: 201, ...numbers },
      { type: 'replayed', key: 'k', scope: 'tenant', status: 201, storeMs: expect.any(Number) },
      { type: 'conflict', key: 'k', scope: 'tenant', storeMs: expect.any(Number) },
    ]);
    const executed = events[0] as Extract<IdempotencyEvent, { type: 'executed' }>;
    expect(executed.handlerMs).toBeGreaterThanOrEqual(15);
    expect(executed.storeMs).toBeGreaterThanOrEqual(0);
  });

  it('released: the handler threw, its status is not stored, its response outgrew the limit', async () => {
    const { idem, events } = engine();
    await expect(
      idem.handle(postRequest('threw'), async () => {
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    await idem.handle(postRequest('503'), answer(503));
    await idem.handle(postRequest('422'), answer(422));
    await idem.handle(postRequest('big'), answer(201, { complete: false }));
    expect(events).toEqual([
      {
        type: 'released',
        key: 'threw',
        scope: 'tenant',
        reason: 'handler_threw',
        status: undefined,
        ...numbers,
      },
      { type: 'released', key: '503', scope: 'tenant', reason: 'not_stored', status: 503, ...numbers },
      { type: 'released', key: '422', scope: 'tenant', reason: 'not_stored', status: 422, ...numbers },
      {
        type: 'released',
        key: 'big',
        scope: 'tenant',
        reason: 'response_too_large',
        status: 201,
        ...numbers,
      },
    ]);
  });

  it('waited: a duplicate waits for the original and replays it', async () => {
    const { idem, events } = engine();
    const { original, finish } = await heldOriginal(idem, 'w');
    const duplicate = idem.handle(postRequest('w'), answer());
    await sleep(30);
    finish();
    await Promise.all([original, duplicate]);
    expect(events.map((e) => e.type)).toEqual(['executed', 'waited', 'replayed']);
    expect(events[1]).toEqual({
      type: 'waited',
      key: 'w',
      scope: 'tenant',
      waitedMs: expect.any(Number),
      result: 'replayed',
    });
  });

  it('waited: in atomic mode too, the wait ends before what came of it is reported', async () => {
    const base = sqliteStore({ url: ':memory:', migrate: true });
    // The duplicate's first claim finds the key in progress, as behind an open transaction.
    let busy = false;
    const store = withStore(
      {
        atomic: (input, work) => {
          if (!busy) return base.atomic(input, work);
          busy = false;
          return Promise.resolve({ outcome: 'in_progress', retryAfterMs: 1 });
        },
      } as Partial<AtomicStore>,
      base,
    );
    const { idem, events } = engine({ store, mode: 'atomic' });
    await idem.handle(postRequest('w'), answer());
    busy = true;
    expect((await idem.handle(postRequest('w'), answer())).kind).toBe('replayed');
    expect(events.map((e) => [e.type, 'result' in e ? e.result : undefined])).toEqual([
      ['executed', undefined],
      ['waited', 'replayed'],
      ['replayed', undefined],
    ]);
  });

  it('waited: 409 at once with concurrency reject, and when the wait runs out', async () => {
    for (const options of [{ concurrency: 'reject' as const }, { wait: 50 }]) {
      const { idem, events } = engine(options);
      const { original, finish } = await heldOriginal(idem, 'busy');
      const outcome = await idem.handle(postRequest('busy'), answer());
      expect(outcome.kind === 'rejected' && outcome.error.code).toBe('request_in_progress');
      finish();
      await original;
      expect(events.map((e) => [e.type, 'result' in e ? e.result : undefined])).toEqual([
        ['waited', 'in_progress'],
        ['executed', undefined],
      ]);
    }
  });

  it('fenced: a save or release the store refuses because the lease was taken over', async () => {
    const store = withStore({ complete: async () => false, release: async () => false });
    const { idem, types } = engine({ store });
    // The key is still held (by the request that took it over, as the store says): 409.
    const late = await idem.handle(postRequest('late'), answer());
    expect(late.kind === 'rejected' && late.error.code).toBe('request_in_progress');
    await idem.handle(postRequest('late-503'), answer(503));
    expect(types()).toEqual(['fenced', 'fenced', 'released']);
  });

  it('lease_renewed while the handler runs; lease_lost when a renewal finds the key taken over', async () => {
    const renewing = engine({ lease: 60 });
    await renewing.idem.handle(postRequest('slow'), async () => {
      await sleep(150);
      return answer()();
    });
    expect(renewing.types().filter((t) => t === 'lease_renewed').length).toBeGreaterThan(0);
    expect(renewing.events.find((e) => e.type === 'lease_renewed')).toEqual({
      type: 'lease_renewed',
      key: 'slow',
      scope: 'tenant',
    });

    for (const [renew, expected] of [
      [async () => false, { type: 'lease_lost', key: 'k', scope: 'tenant' }],
      [
        () => Promise.reject(new Error('renew refused')),
        { type: 'store_error', operation: 'renew', key: 'k', scope: 'tenant', error: expect.any(Error) },
      ],
    ] as const) {
      const { idem, events } = engine({ store: withStore({ renew }), lease: 60 });
      await idem.handle(postRequest('k'), async () => {
        await sleep(100);
        return answer()();
      });
      expect(events).toContainEqual(expected);
    }
  });

  it('store_error: a failed claim (503), a save that failed or timed out (the answer stands)', async () => {
    const down = new Error('connection refused');
    const failing = engine({ store: withStore({ claim: () => Promise.reject(down) }) });
    const outcome = await failing.idem.handle(postRequest('k'), answer());
    expect(outcome.kind === 'rejected' && outcome.error.status).toBe(503);
    expect(failing.events).toEqual([
      { type: 'store_error', key: 'k', scope: 'tenant', operation: 'claim', error: down },
    ]);

    const stuck = engine({ store: withStore({ complete: () => new Promise(() => {}) }), storeTimeout: 30 });
    expect((await stuck.idem.handle(postRequest('k'), answer())).kind).toBe('executed');
    expect(stuck.types()).toEqual(['store_error', 'executed']);
    expect(stuck.events[0]).toMatchObject({
      operation: 'complete',
      error: expect.objectContaining({ message: expect.stringMatching(/did not answer within 30 ms/) }),
    });
  });

  it('store_error: a wait that fails', async () => {
    const store = withStore({
      claim: async () => ({ outcome: 'in_progress', retryAfterMs: 100 }),
      wait: () => Promise.reject(new Error('pubsub gone')),
    });
    const { idem, events } = engine({ store });
    expect((await idem.handle(postRequest('k'), answer())).kind).toBe('rejected');
    expect(
      events.map((e) => [e.type, 'operation' in e ? e.operation : 'result' in e ? e.result : '']),
    ).toEqual([
      ['store_error', 'wait'],
      ['waited', 'store_error'],
    ]);
  });

  it('rejected: key required, key invalid, body too large, a saved answer it cannot decrypt', async () => {
    const { idem, events } = engine({ required: true });
    await idem.handle(postRequest(undefined), answer());
    await idem.handle(postRequest('bad\u0001key'), answer());
    const tooLarge = await idem.handle(
      postRequest('big', undefined, {
        readBody: async () => {
          throw idem.bodyTooLarge();
        },
      }),
      answer(),
    );
    expect(tooLarge.kind === 'rejected' && tooLarge.error.status).toBe(413);

    const store = memoryStore();
    const before = engine({ store, encryptionKey: randomBytes(32) });
    await before.idem.handle(postRequest('sealed'), answer());
    const after = engine({ store, encryptionKey: randomBytes(32) });
    await after.idem.handle(postRequest('sealed'), answer());
    expect([...events, ...after.events]).toEqual([
      { type: 'rejected', reason: 'key_missing', key: undefined, scope: undefined },
      { type: 'rejected', reason: 'key_invalid', key: undefined, scope: undefined },
      { type: 'rejected', reason: 'body_too_large' },
      { type: 'rejected', reason: 'replay_unreadable', key: 'sealed', scope: 'tenant' },
    ]);
  });

  it('atomic mode: executed, released, replayed and a store error, with the handler timed apart', async () => {
    const store = sqliteStore({ url: ':memory:', migrate: true });
    const { idem, events } = engine({ store, mode: 'atomic' });
    await idem.handle(postRequest('a'), answer());
    await idem.handle(postRequest('a'), answer());
    await idem.handle(postRequest('b'), answer(500));
    await expect(
      idem.handle(postRequest('c'), async () => {
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    expect(events).toEqual([
      { type: 'executed', key: 'a', scope: 'tenant', status: 201, ...numbers },
      { type: 'replayed', key: 'a', scope: 'tenant', status: 201, storeMs: expect.any(Number) },
      { type: 'released', key: 'b', scope: 'tenant', reason: 'not_stored', status: 500, ...numbers },
      { type: 'released', key: 'c', scope: 'tenant', reason: 'handler_threw', ...numbers },
    ]);

    const broken = new Error('disk I/O error');
    const failing = engine({
      store: withStore({ atomic: () => Promise.reject(broken) } as never, store),
      mode: 'atomic',
    });
    await failing.idem.handle(postRequest('d'), answer());
    expect(failing.events).toEqual([
      { type: 'store_error', key: 'd', scope: 'tenant', operation: 'atomic', error: broken },
    ]);
  });

  it('a listener that throws or rejects changes no answer and is reported once', async () => {
    const warnings: Error[] = [];
    const onWarning = (warning: Error) => warnings.push(warning);
    process.on('warning', onWarning);
    try {
      for (const onEvent of [
        () => {
          throw new Error('listener bug');
        },
        async () => {
          throw new Error('async listener bug');
        },
      ]) {
        const idem = createIdempotency({ store: memoryStore(), onEvent });
        expect((await idem.handle(postRequest('k'), answer())).kind).toBe('executed');
        expect((await idem.handle(postRequest('k'), answer())).kind).toBe('replayed');
      }
      await vi.waitFor(() => expect(warnings).toHaveLength(2));
      expect(warnings.map((w) => w.message)).toEqual([
        expect.stringContaining('listener bug'),
        expect.stringContaining('async listener bug'),
      ]);
    } finally {
      process.off('warning', onWarning);
    }
  });

  it('times events with the clock reads its timeouts and leases make anyway', async () => {
    const saved = new Map<string, StoredResponse>();
    // Claims and saves read no clock, so every read counted is the engine's.
    const store = withStore({
      claim: async ({ key }) => {
        const response = saved.get(key);
        return response ? { outcome: 'replay', response } : { outcome: 'acquired', token: 't' };
      },
      complete: async (_scope, key, _token, response) => saved.set(key, response) !== undefined,
    });
    const clocks = [vi.spyOn(performance, 'now'), vi.spyOn(Date, 'now')];
    const reads = async (idem: ReturnType<typeof createIdempotency>, key: string) => {
      for (const clock of clocks) clock.mockClear();
      await idem.handle(postRequest(key), answer());
      return clocks.reduce((sum, clock) => sum + clock.mock.calls.length, 0);
    };
    const quiet = createIdempotency({ store });
    const heard = createIdempotency({ store, onEvent: () => undefined });
    // The claim's timeout and the wait deadline share a read; the lease and the save's timeout one each.
    expect(await reads(quiet, 'a')).toBe(3);
    // The listener's timings take one more: when the save answered.
    expect(await reads(heard, 'b')).toBe(4);
    expect(await reads(quiet, 'a')).toBe(2);
    expect(await reads(heard, 'b')).toBe(2);
  });

  it('refuses an onEvent that is not a function', () => {
    expect(() => createIdempotency({ store: memoryStore(), onEvent: 'log' as never })).toThrow(/`onEvent`/);
  });
});
