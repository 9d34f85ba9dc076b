import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { ClaimInput } from '../src/core/contract/index.js';
import { Waiters } from '../src/stores/internal.js';
import { MemoryStoreFullError, memoryStore } from '../src/stores/memory.js';
import { describeIdempotentConformance } from '../src/testing/idempotent-suite.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import { expectWaitWokenBy } from './support/store-calls.js';

describeStoreConformance('memory', async () => ({ store: memoryStore() }));
describeIdempotentConformance('memory', async () => ({ store: memoryStore() }));

const LONG = { leaseMs: 30_000, retainMs: 60_000 };

function input(key: string, times: { leaseMs: number; retainMs: number } = LONG): ClaimInput {
  return { scope: 'tenant', key, fingerprint: 'fp', ...times };
}

const response = { status: 201, headers: { 'content-type': 'text/plain' }, body: new Uint8Array([1, 2, 3]) };

async function tokenOf(store: ReturnType<typeof memoryStore>, key: string): Promise<string> {
  const result = await store.claim(input(key));
  if (result.outcome !== 'acquired') throw new Error(`expected acquired, got ${result.outcome}`);
  return result.token;
}

describe('memoryStore copies', () => {
  it('keeps its own copy of a response, in a buffer of its own (not a slice of the shared pool)', async () => {
    const store = memoryStore();
    const body = Buffer.from('{"id":1}');
    const headers = { 'content-type': 'application/json' };
    await store.complete('tenant', 'copy', await tokenOf(store, 'copy'), { status: 201, headers, body });
    body.fill(0);
    headers['content-type'] = 'text/plain';
    const replay = await store.claim(input('copy'));
    if (replay.outcome !== 'replay') throw new Error(`expected replay, got ${replay.outcome}`);
    expect(Buffer.from(replay.response.body).toString()).toBe('{"id":1}');
    expect(replay.response.headers).toEqual({ 'content-type': 'application/json' });
    expect(replay.response.body.buffer.byteLength).toBe(8);
    await store.close();
  });
});

describe('memoryStore size cap', () => {
  it('evicts the records completed longest ago first and never an in-progress one', async () => {
    const store = memoryStore({ maxRecords: 3 });
    const tokens = {
      a: await tokenOf(store, 'a'),
      b: await tokenOf(store, 'b'),
      c: await tokenOf(store, 'c'),
    };
    await expect(store.claim(input('x'))).rejects.toThrow(MemoryStoreFullError);
    await expect(store.claim(input('x'))).rejects.toThrow(/maxRecords/);

    expect(await store.complete('tenant', 'b', tokens.b, response)).toBe(true);
    expect(await store.complete('tenant', 'a', tokens.a, response)).toBe(true);
    // b completed first, so it goes first although a was claimed earlier.
    expect((await store.claim(input('d'))).outcome).toBe('acquired');
    expect((await store.claim(input('a'))).outcome).toBe('replay');
    expect((await store.claim(input('c'))).outcome).toBe('in_progress');

    expect((await store.claim(input('b'))).outcome).toBe('acquired');
    expect((await store.claim(input('c'))).outcome).toBe('in_progress');
    expect((await store.claim(input('d'))).outcome).toBe('in_progress');
    await expect(store.claim(input('a'))).rejects.toThrow(MemoryStoreFullError);
    await store.close();
  });

  it('makes room from expired records before refusing a claim', async () => {
    const store = memoryStore({ maxRecords: 2 });
    await store.claim(input('short', { leaseMs: 20, retainMs: 40 }));
    await store.claim(input('long'));
    await sleep(100);
    expect((await store.claim(input('new'))).outcome).toBe('acquired');
    expect((await store.claim(input('long'))).outcome).toBe('in_progress');
    await store.close();
  });

  it('the sweep timer removes expired records', async () => {
    const store = memoryStore({ sweepIntervalMs: 20 });
    await store.claim(input('short', { leaseMs: 10, retainMs: 30 }));
    await sleep(150);
    expect(await store.purgeExpired()).toBe(0);
    await store.close();
  });
});

describe('memoryStore options', () => {
  it.each([
    [{ maxRecords: 0 }, /maxRecords.*positive integer/],
    [{ maxRecords: 1.5 }, /maxRecords/],
    [{ maxRecords: Number.NaN }, /maxRecords/],
    [{ sweepIntervalMs: -1 }, /sweepIntervalMs.*positive integer/],
    [{ sweepIntervalMs: '10' as unknown as number }, /sweepIntervalMs/],
  ])('rejects %o', (options, message) => {
    expect(() => memoryStore(options)).toThrow(message);
  });

  it('rejects a bad purge batch size', async () => {
    const store = memoryStore();
    await expect(store.purgeExpired(0)).rejects.toThrow(/batchSize/);
    await store.close();
  });
});

describe('memoryStore waiters', () => {
  it('close() wakes pending waits', async () => {
    const store = memoryStore();
    await store.claim(input('held'));
    await expectWaitWokenBy(store, 'tenant', 'held', () => store.close(), { settleMs: 20 });
  });

  it('every waiter leaves the registry when woken or timed out', async () => {
    const waiters = new Waiters();
    const woken = Promise.all([waiters.sleep('a', 120_000), waiters.sleep('a', 120_000)]);
    const timedOut = waiters.sleep('b', 10);
    expect(waiters.size).toBe(3);
    waiters.wake('a');
    await woken;
    expect(waiters.size).toBe(1);
    await timedOut;
    expect(waiters.size).toBe(0);
  });
});
