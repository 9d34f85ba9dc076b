import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { Redis } from 'ioredis';
import pg from 'pg';

/**
 * Tests that need PostgreSQL or Redis call these at module load. With CI=true an unreachable
 * service is a failure; elsewhere the suite is skipped with a loud message, never silently passed.
 */
export const PG_URL = process.env.RETRYSAFE_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
export const REDIS_URL = process.env.RETRYSAFE_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';

function reachable(port: number, host = '127.0.0.1', timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ port, host });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
  });
}

export async function requireService(name: string, port: number): Promise<boolean> {
  if (await reachable(port)) return true;
  const message = `${name} on 127.0.0.1:${port} is unreachable`;
  if (process.env.CI === 'true') throw new Error(`${message}; CI=true makes these tests mandatory`);
  console.warn(`\n!!!!!!!! SKIPPING ${name} TESTS: ${message} !!!!!!!!\n`);
  return false;
}

export const hasPostgres = await requireService('PostgreSQL', 5432);
export const hasRedis = await requireService('Redis', 6379);

/** A name unique to this run, usable as a schema name or key prefix. */
export function uniqueName(prefix = 'rs_test'): string {
  return `${prefix}_${process.pid}_${randomBytes(4).toString('hex')}`;
}

/** Drops `schemas` and everything in them from the shared PostgreSQL. */
export async function dropSchemas(...schemas: string[]): Promise<void> {
  if (schemas.length === 0) return;
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  try {
    for (const schema of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  } finally {
    await admin.end();
  }
}

/** Deletes the keys under each of `prefixes` from the shared Redis. */
export async function deleteRedisKeys(...prefixes: string[]): Promise<void> {
  const admin = new Redis(REDIS_URL);
  try {
    for (const prefix of prefixes) {
      for await (const keys of admin.scanStream({ match: `${prefix}*`, count: 500 })) {
        if ((keys as string[]).length > 0) await admin.del(...(keys as string[]));
      }
    }
  } finally {
    await admin.quit();
  }
}

/** The machine's MariaDB (or MySQL); tests make a database of their own on it. */
export const MYSQL_URL = process.env.RETRYSAFE_TEST_MYSQL_URL ?? 'mysql://root@127.0.0.1:3306/test';
export const hasMysql = await requireService('MariaDB', 3306);

/** Creates a database named `retrysafe_<random>` and answers its URL; `drop()` removes it. */
export async function mysqlDatabase(): Promise<{ name: string; url: string; drop(): Promise<void> }> {
  const { default: mysql } = await import('mysql2/promise');
  const name = uniqueName('retrysafe');
  const admin = await mysql.createConnection({ uri: MYSQL_URL });
  try {
    await admin.query(`CREATE DATABASE \`${name}\``);
  } finally {
    await admin.end();
  }
  const url = new URL(MYSQL_URL);
  url.pathname = `/${name}`;
  return {
    name,
    url: url.toString(),
    async drop() {
      const admin = await mysql.createConnection({ uri: MYSQL_URL });
      try {
        await admin.query(`DROP DATABASE IF EXISTS \`${name}\``);
      } finally {
        await admin.end();
      }
    },
  };
}
