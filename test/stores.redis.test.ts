import { type ChildProcess, spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ClaimInput, IdempotencyStore, StoredResponse } from '../src/core/contract/index.js';
import { redisStore } from '../src/stores/redis/index.js';
import { describeIdempotentConformance } from '../src/testing/idempotent-suite.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import { freePort } from './support/free-port.js';
import { deleteRedisKeys, hasRedis, REDIS_URL, uniqueName } from './support/services.js';
import { onEachWrite } from './support/socket-writes.js';

const claimInput = (key: string): ClaimInput => ({
  scope: 's',
  key,
  fingerprint: 'f',
  leaseMs: 5000,
  retainMs: 60_000,
});

describe.skipIf(!hasRedis)('redis', () => {
  /** A store under a key prefix of its own, deleted afterwards. */
  const redisUnderPrefix = async () => {
    const prefix = `${uniqueName('rs_redis')}:`;
    return {
      store: redisStore({ url: REDIS_URL, prefix }),
      expiresNatively: true,
      listsInScanOrder: true,
      cleanup: () => deleteRedisKeys(prefix),
    };
  };
  describeStoreConformance('redis', redisUnderPrefix);
  describeIdempotentConformance('redis', redisUnderPrefix);

  it('rejects bad options naming the option', () => {
    expect(() => redisStore({} as never)).toThrow(/`client`, `url` or `clusterNodes`/);
    expect(() => redisStore({ url: REDIS_URL, durability: { replicas: 0, timeoutMs: 100 } })).toThrow(
      /`durability.replicas`/,
    );
    expect(() => redisStore({ url: REDIS_URL, commandTimeoutMs: -1 })).toThrow(/`commandTimeoutMs`/);
  });

  it('claims sent in one turn of the event loop reach Redis in one write', async () => {
    const prefix = `${uniqueName('rs_redis_batch')}:`;
    const client = new Redis(REDIS_URL);
    const store = redisStore({ client, prefix });
    try {
      await client.ping();
      let writes = 0;
      onEachWrite(client.stream, () => writes++);
      const claims = await Promise.all(
        Array.from({ length: 10 }, (_, i) => store.claim(claimInput(`k${i}`))),
      );
      expect(claims.map((c) => c.outcome)).toEqual(Array(10).fill('acquired'));
      expect(writes).toBe(1);
    } finally {
      await store.close();
      await deleteRedisKeys(prefix);
      await client.quit();
    }
  });

  it('durability: a takeover claim short of replicas ends its lease instead of deleting the finished steps', async () => {
    // Issue 32: releasing the refused claim deleted the record, and the retry ran its steps again.
    const prefix = `${uniqueName('rs_redis_durable')}:`;
    const plain = redisStore({ url: REDIS_URL, prefix });
    // A standalone Redis has no replica: every claim of this store is short of one.
    const durable = redisStore({ url: REDIS_URL, prefix, durability: { replicas: 1, timeoutMs: 20 } });
    try {
      const input: ClaimInput = { scope: 's', key: 'k', fingerprint: 'fp', leaseMs: 100, retainMs: 60_000 };
      const first = await plain.claim(input);
      if (first.outcome !== 'acquired') throw new Error(first.outcome);
      expect(
        await plain.saveStep('s', 'k', first.token, { name: 'charged', value: '"ch_1"' }, 'request'),
      ).toBe(true);
      await sleep(200);
      await expect(durable.claim(input)).rejects.toThrow(/replicas/);
      expect((await plain.get('s', 'k'))?.steps).toEqual(['charged']);
      // The refused claim's lease ends 1 ms after it (renewed to 1 ms: a release would delete the
      // steps), by Redis's clock: a claim in that same millisecond still finds it held.
      await sleep(20);
      const again = await plain.claim(input);
      expect(again.outcome === 'acquired' && again.steps).toEqual([{ name: 'charged', value: '"ch_1"' }]);
    } finally {
      await Promise.all([plain.close(), durable.close()]);
      await deleteRedisKeys(prefix);
    }
  });

  it('claims a new key with one native SET … NX … GET, no script', async () => {
    const prefix = `${uniqueName('rs_redis_native')}:`;
    const client = new Redis(REDIS_URL);
    const monitor = await new Redis(REDIS_URL).monitor();
    const store = redisStore({ client, prefix });
    try {
      const seen: string[][] = [];
      const marker = `${prefix}end`;
      const sawMarker = new Promise<void>((resolve) =>
        monitor.on('monitor', (_time: string, args: string[]) => {
          if (args[1] === marker) resolve();
          else if (args[1]?.startsWith(prefix) || args[0]?.toLowerCase().startsWith('eval')) seen.push(args);
        }),
      );
      const claimed = await store.claim(claimInput('k'));
      expect(claimed.outcome).toBe('acquired');
      await client.get(marker);
      await sawMarker;
      expect(seen.map((args) => args.slice(0, 2).concat(args.slice(3)))).toEqual([
        ['set', `${prefix}1:sk`, 'PX', '60000', 'NX', 'GET'],
      ]);
    } finally {
      await store.close();
      monitor.disconnect();
      await deleteRedisKeys(prefix);
      await client.quit();
    }
  });

  it('works on a client the caller owns and leaves it open', async () => {
    const prefix = `${uniqueName('rs_redis_own')}:`;
    const client = new Redis(REDIS_URL, { commandTimeout: 2000 });
    const store = redisStore({ client, prefix });
    try {
      const claimed = await store.claim(claimInput('k'));
      expect(claimed.outcome).toBe('acquired');
      await store.close();
      expect(await client.exists(`${prefix}1:sk`)).toBe(1);
      expect(await client.pttl(`${prefix}1:sk`)).toBeGreaterThan(5000);
    } finally {
      await deleteRedisKeys(prefix);
      await client.quit();
    }
  });
});

/** A Redis of this test's own on a free port, without persistence, so it can be restarted freely. */
describe.skipIf(!hasRedis)('redis restart (own redis-server, no persistence)', () => {
  let port: number;
  let server: ChildProcess | undefined;
  let store: IdempotencyStore;
  const prefix = 'rs_restart:';

  async function startRedis(): Promise<void> {
    server = spawn(
      'redis-server',
      ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
      { stdio: 'ignore' },
    );
    const probe = new Redis({ port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {});
    for (let attempt = 0; attempt < 100; attempt++) {
      try {
        await probe.connect();
        await probe.ping();
        probe.disconnect();
        return;
      } catch {
        await sleep(50);
      }
    }
    probe.disconnect();
    throw new Error(`redis-server on port ${port} did not start`);
  }

  async function stopRedis(): Promise<void> {
    const child = server;
    server = undefined;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
  }

  const input = (key: string): ClaimInput => ({
    scope: 'tenant',
    key,
    fingerprint: 'fp',
    leaseMs: 10_000,
    retainMs: 60_000,
  });
  const response: StoredResponse = {
    status: 201,
    headers: { 'content-type': 'application/json' },
    body: new TextEncoder().encode('{"id":1}'),
  };
  /** The bound this test puts on "promptly": far above the store's 2 s command timeout. */
  const HANG_BOUND_MS = 5000;
  const hung = () => sleep(HANG_BOUND_MS).then(() => 'hung' as const);

  beforeAll(async () => {
    port = await freePort();
    await startRedis();
    store = redisStore({ url: `redis://127.0.0.1:${port}`, prefix });
  });

  afterAll(async () => {
    await store?.close();
    await stopRedis();
  });

  it('writes only prefixed keys and waits on one pub/sub subscription', async () => {
    const claimed = await store.claim(input('prefixed'));
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    const waiting = store.wait('tenant', 'prefixed', 10_000);
    expect(await store.complete('tenant', 'prefixed', claimed.token, response)).toBe(true);
    await waiting;
    const admin = new Redis({ port });
    try {
      const keys = await admin.keys('*');
      expect(keys.length).toBeGreaterThan(0);
      for (const key of keys) expect(key.startsWith(prefix)).toBe(true);
      const subscribers = async () => (await admin.pubsub('NUMSUB', `${prefix}settled`))[1];
      for (let attempt = 0; attempt < 50 && (await subscribers()) === 0; attempt++) await sleep(100);
      expect(await subscribers()).toBe(1);
    } finally {
      admin.disconnect();
    }
  });

  it('rejects promptly while Redis is down, recovers by itself, and forgets keys across a restart', async () => {
    const claimed = await store.claim(input('before-restart'));
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    expect(await store.complete('tenant', 'before-restart', claimed.token, response)).toBe(true);
    expect((await store.claim(input('before-restart'))).outcome).toBe('replay');

    await stopRedis();
    for (const call of [
      () => store.claim(input('during-outage')),
      () => store.complete('tenant', 'before-restart', claimed.token, response),
      () => store.release('tenant', 'before-restart', claimed.token),
      () => store.wait('tenant', 'before-restart', 60_000),
    ]) {
      const outcome = await Promise.race([
        call().then(
          () => 'resolved',
          () => 'rejected',
        ),
        hung(),
      ]);
      expect(outcome).toBe('rejected');
    }

    await startRedis();
    let recovered = false;
    for (let attempt = 0; attempt < 50 && !recovered; attempt++) {
      recovered = await store.claim(input('after-restart')).then(
        (result) => result.outcome === 'acquired',
        () => false,
      );
      if (!recovered) await sleep(200);
    }
    expect(recovered).toBe(true);
    // Without persistence the completed key is gone: its retry would run the operation again.
    // This is the documented trade-off of redisStore, not a bug.
    expect((await store.claim(input('before-restart'))).outcome).toBe('acquired');
  });
});
