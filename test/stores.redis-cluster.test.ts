import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { type CapturedResponse, createIdempotency } from '../src/core/adapter.js';
import { ReplicationError, redisStore } from '../src/stores/redis/index.js';
import { postRequest } from '../src/testing/engine-request.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import {
  clusterClient,
  deleteClusterKeys,
  hasRedisCluster,
  REDIS_CLUSTER_NODES,
  underClusterPrefix,
} from './support/redis-cluster.js';
import { uniqueName } from './support/services.js';
import { onEachWrite } from './support/socket-writes.js';
import { listAllKeys } from './support/store-calls.js';

/** The local cluster of scripts/redis-cluster.sh: 3 masters, 3 replicas. */
describe.skipIf(!hasRedisCluster)('redis cluster', () => {
  describeStoreConformance('redis cluster', async () => {
    const prefix = `${uniqueName('rs_cluster')}:`;
    const admin = clusterClient();
    return {
      store: redisStore({ clusterNodes: REDIS_CLUSTER_NODES, prefix }),
      expiresNatively: true,
      listsInScanOrder: true,
      async cleanup() {
        await deleteClusterKeys(admin, prefix);
        await admin.quit();
      },
    };
  });

  it('200 concurrent duplicates of one key run the handler once', async () => {
    await underClusterPrefix('rs_cluster_dup', async (prefix) => {
      const store = redisStore({ clusterNodes: REDIS_CLUSTER_NODES, prefix });
      const idempotency = createIdempotency({ store, scope: () => 'tenant' });
      let runs = 0;
      const handler = async (): Promise<CapturedResponse> => {
        runs++;
        await sleep(200);
        return { status: 201, headers: {}, body: Buffer.from('{"id":1}'), complete: true };
      };
      try {
        const outcomes = await Promise.all(
          Array.from({ length: 200 }, () => idempotency.handle(postRequest('hot'), handler)),
        );
        expect(runs).toBe(1);
        expect(outcomes.filter((outcome) => outcome.kind === 'executed')).toHaveLength(1);
        // The others replayed the one response or were told it is in progress (409), none ran it.
        for (const outcome of outcomes) expect(['executed', 'replayed', 'rejected']).toContain(outcome.kind);
      } finally {
        await store.close();
      }
    });
  });

  it('claims sent in one turn of the event loop reach each master in one write', async () => {
    await underClusterPrefix('rs_cluster_batch', async (prefix, client) => {
      const store = redisStore({ client, prefix });
      try {
        // Ready (slots known), and a connection open to every master.
        await client.exists(`${prefix}probe`);
        await Promise.all(client.nodes('master').map((node) => node.ping()));
        const writes = new Map<string, number>();
        for (const node of client.nodes('master')) {
          const port = String(node.options.port);
          onEachWrite(node.stream, () => writes.set(port, (writes.get(port) ?? 0) + 1));
        }
        const claims = await Promise.all(
          Array.from({ length: 30 }, (_, i) =>
            store.claim({ scope: 's', key: `k${i}`, fingerprint: 'f', leaseMs: 5000, retainMs: 60_000 }),
          ),
        );
        expect(claims.map((c) => c.outcome)).toEqual(Array(30).fill('acquired'));
        // 30 keys land on every master; each got its claims in one write.
        expect([...writes.values()]).toEqual([1, 1, 1]);
      } finally {
        await store.close();
      }
    });
  });

  it('durability: a claim confirmed by fewer replicas than asked fails and is released; one confirmed succeeds', async () => {
    await underClusterPrefix('rs_cluster_wait', async (prefix) => {
      const claim = { scope: 's', key: 'k', fingerprint: 'f', leaseMs: 5000, retainMs: 60_000 };
      // Each master has one replica: two never confirm.
      const wanting = redisStore({
        clusterNodes: REDIS_CLUSTER_NODES,
        prefix,
        durability: { replicas: 2, timeoutMs: 100 },
      });
      const durable = redisStore({
        clusterNodes: REDIS_CLUSTER_NODES,
        prefix,
        durability: { replicas: 1, timeoutMs: 2000 },
      });
      try {
        await expect(wanting.claim(claim)).rejects.toThrow(ReplicationError);
        expect(await durable.get('s', 'k')).toBeUndefined();
        const claimed = await durable.claim(claim);
        if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
        const saved = { status: 201, headers: {}, body: Buffer.from('ok') };
        expect(await durable.complete('s', 'k', claimed.token, saved)).toBe(true);
        expect((await durable.claim(claim)).outcome).toBe('replay');
      } finally {
        await wanting.close();
        await durable.close();
      }
    });
  });

  it('300 fresh keys spread over every master, and list walks them all', async () => {
    await underClusterPrefix('rs_cluster_spread', async (prefix, client) => {
      // A client the caller owns: the store uses it and leaves it open.
      const store = redisStore({ client, prefix });
      try {
        const claims = await Promise.all(
          Array.from({ length: 300 }, (_, i) =>
            store.claim({
              scope: 'tenant',
              key: `k${i}`,
              fingerprint: 'fp',
              leaseMs: 5000,
              retainMs: 60_000,
            }),
          ),
        );
        expect(claims.filter((claim) => claim.outcome === 'acquired')).toHaveLength(300);
        const masters = client.nodes('master');
        expect(masters).toHaveLength(3);
        for (const master of masters) {
          const [, keys] = await master.scan('0', 'MATCH', `${prefix}*`, 'COUNT', 10_000);
          expect(keys.length).toBeGreaterThan(0);
        }
        const listed = await listAllKeys(store, 'tenant', 70);
        expect(listed.sort()).toEqual(Array.from({ length: 300 }, (_, i) => `k${i}`).sort());
      } finally {
        await store.close();
      }
    });
  });
});
