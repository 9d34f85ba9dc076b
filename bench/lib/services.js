import Redis from 'ioredis';
import pg from 'pg';

export const PG_URL = process.env.RETRYSAFE_BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
export const REDIS_URL = process.env.RETRYSAFE_BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379';

/** A PostgreSQL URL whose connections use `schema` (created here) as their search path. */
export async function pgSchemaUrl(schema) {
  await withPg((client) => client.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`));
  const url = new URL(PG_URL);
  url.searchParams.set('schema', schema);
  return url.toString();
}

export async function withPg(fn) {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** Drops every PostgreSQL schema and Redis key this run created (all of them contain `runId`). */
export async function cleanup(runId) {
  await withPg(async (client) => {
    const { rows } = await client.query('SELECT nspname FROM pg_namespace WHERE nspname LIKE $1', [
      `${runId}%`,
    ]);
    for (const { nspname } of rows) await client.query(`DROP SCHEMA "${nspname}" CASCADE`);
  }).catch((error) => console.error(`PostgreSQL cleanup: ${error.message}`));
  const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 });
  try {
    await redis.connect();
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `*${runId}*`, 'COUNT', 5000);
      cursor = next;
      if (keys.length > 0) await redis.unlink(...keys);
    } while (cursor !== '0');
  } catch (error) {
    console.error(`Redis cleanup: ${error.message}`);
  } finally {
    redis.disconnect();
  }
}
