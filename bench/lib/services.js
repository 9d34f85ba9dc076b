import Redis from 'ioredis';
import mysql from 'mysql2/promise';
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

export const MYSQL_URL = process.env.RETRYSAFE_BENCH_MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';

/** A mysql:// URL naming the database `name`, which the loan desk or the floor creates on start. */
export function mysqlDatabaseUrl(name) {
  const url = new URL(MYSQL_URL);
  url.pathname = `/${name}`;
  return url.toString();
}

export async function withMysql(uri, fn) {
  const connection = await mysql.createConnection({ uri });
  try {
    return await fn(connection);
  } finally {
    await connection.end();
  }
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

/** Drops every PostgreSQL schema, MariaDB database and Redis key this run created (all of them contain `runId`). */
export async function cleanup(runId) {
  await withMysql(MYSQL_URL, async (connection) => {
    const [rows] = await connection.query(
      'SELECT schema_name AS name FROM information_schema.schemata WHERE schema_name LIKE ?',
      [`${runId}%`],
    );
    for (const { name } of rows) await connection.query(`DROP DATABASE \`${name}\``);
  }).catch((error) => console.error(`MariaDB cleanup: ${error.message}`));
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
