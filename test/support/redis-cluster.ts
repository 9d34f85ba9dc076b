import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Cluster } from 'ioredis';
import { uniqueName } from './services.js';

/**
 * The local Redis Cluster of scripts/redis-cluster.sh (3 masters, 3 replicas on 7100-7105), which
 * `.ci/run` starts. A test file that needs it awaits `hasRedisCluster` at module load: the script
 * is run here when the cluster is not up, so `npx vitest run` works without `.ci/run`; without it
 * the suite fails under CI=true and is skipped loudly elsewhere.
 */
export const REDIS_CLUSTER_PORT = Number(process.env.RETRYSAFE_REDIS_CLUSTER_PORT ?? 7100);
export const REDIS_CLUSTER_NODES = Array.from({ length: 6 }, (_, i) => `127.0.0.1:${REDIS_CLUSTER_PORT + i}`);
const SCRIPT = fileURLToPath(new URL('../../scripts/redis-cluster.sh', import.meta.url));

/** Runs `scripts/redis-cluster.sh start`: starts the nodes that are down and waits until the cluster is ok. */
export async function startRedisCluster(): Promise<void> {
  await promisify(execFile)(SCRIPT, ['start'], { timeout: 60_000 });
}

async function ensureRedisCluster(): Promise<boolean> {
  try {
    await startRedisCluster();
    return true;
  } catch (error) {
    const message = `the Redis Cluster on 127.0.0.1:${REDIS_CLUSTER_PORT}-${REDIS_CLUSTER_PORT + 5} could not be started (${(error as Error).message.trim()})`;
    if (process.env.CI === 'true') throw new Error(`${message}; CI=true makes these tests mandatory`);
    console.warn(`\n!!!!!!!! SKIPPING REDIS CLUSTER TESTS: ${message} !!!!!!!!\n`);
    return false;
  }
}

export const hasRedisCluster = await ensureRedisCluster();

/** A Cluster client on the local cluster; commands reject after 2 s instead of queueing. */
export function clusterClient(): Cluster {
  return new Cluster(REDIS_CLUSTER_NODES.slice(0, 3), { redisOptions: { commandTimeout: 2000 } });
}

/** Deletes the keys under `prefix` on every master. */
export async function deleteClusterKeys(cluster: Cluster, prefix: string): Promise<void> {
  for (const node of cluster.nodes('master')) {
    for await (const keys of node.scanStream({ match: `${prefix}*`, count: 500 })) {
      for (const key of keys as string[]) await cluster.del(key);
    }
  }
}

/**
 * Runs `test` with a key prefix of its own (from `name`) and a cluster client, then deletes the
 * keys under the prefix and quits the client. Stores the test opens, it closes itself.
 */
export async function underClusterPrefix(
  name: string,
  test: (prefix: string, client: Cluster) => Promise<void>,
): Promise<void> {
  const prefix = `${uniqueName(name)}:`;
  const client = clusterClient();
  try {
    await test(prefix, client);
  } finally {
    await deleteClusterKeys(client, prefix);
    await client.quit();
  }
}
