// The stores of the torture run: for each, a private place (a database, a file, a key prefix) on
// the run's own servers (servers.js), how to reach it through the run's TCP proxy, and the handles
// the schedule's faults need (end the app's connections, lock the effect table, restart the
// server, kill a cluster master) and the checker needs (effects).
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import { Redis } from 'ioredis';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { startPgBouncer } from '../../test/support/pgbouncer-process.js';
import { privateMariadb, privatePostgres, privateRedis, privateRedisCluster } from './servers.js';
import { startTcpProxy } from './tcp-proxy.js';

/** How long a restarted server stays down before it is started again. */
const RESTART_PAUSE_MS = 500;

const EFFECT_COLUMNS = 'scope, idem_key, item, id, runs';
const uniqueName = () => `rs_torture_${process.pid}_${randomBytes(4).toString('hex')}`;
const withPort = (url, port, database) => {
  const next = new URL(url);
  next.hostname = '127.0.0.1';
  next.port = String(port);
  if (database !== undefined) next.pathname = `/${database}`;
  return next.toString();
};
const asEffects = (rows) =>
  rows.map((row) => ({
    scope: row.scope,
    key: row.idem_key,
    item: row.item,
    id: String(row.id),
    runs: Number(row.runs),
  }));

async function onePg(url, use) {
  const client = new pg.Client({ connectionString: url });
  client.on('error', () => {});
  await client.connect();
  try {
    return await use(client);
  } finally {
    await client.end().catch(() => {});
  }
}

/** A database of its own on the run's PostgreSQL, and the faults that reach it. */
async function postgresDatabase() {
  const { url: serverUrl, restart } = await privatePostgres();
  const name = uniqueName();
  await onePg(serverUrl, (admin) => admin.query(`CREATE DATABASE "${name}"`));
  const url = withPort(serverUrl, new URL(serverUrl).port, name);
  return {
    url,
    adminUrl: serverUrl,
    /** The whole server, crashed and started again (`pg_ctl stop -m immediate`, then start). */
    restart: () => restart(RESTART_PAUSE_MS),
    killConnections: () =>
      onePg(serverUrl, async (admin) => {
        const { rows } = await admin.query(
          'SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE datname = $1',
          [name],
        );
        return rows[0].n;
      }),
    lockEffects: (ms) =>
      onePg(url, async (client) => {
        await client.query('BEGIN');
        await client.query('LOCK TABLE torture_effect IN ACCESS EXCLUSIVE MODE');
        await sleep(ms);
        await client.query('ROLLBACK');
      }),
    effects: () =>
      onePg(url, async (client) =>
        asEffects((await client.query(`SELECT ${EFFECT_COLUMNS} FROM torture_effect`)).rows),
      ),
    drop: () => onePg(serverUrl, (admin) => admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)),
  };
}

/**
 * Every target: `open()` gives `{ env, faults, effects(), close() }`, `env` for the app processes
 * and `faults` the kinds this store can be given beyond those every target gets.
 */
export const TARGETS = {
  sqlite: {
    modes: ['lease', 'atomic'],
    async open() {
      const dir = mkdtempSync(path.join(tmpdir(), 'rs-torture-'));
      const file = path.join(dir, 'torture.db');
      const read = () => {
        const db = new Database(file, { readonly: true });
        try {
          return asEffects(db.prepare(`SELECT ${EFFECT_COLUMNS} FROM torture_effect`).all());
        } finally {
          db.close();
        }
      };
      return {
        env: { STORE: 'sqlite', STORE_URL: file },
        faults: {
          // The database's write lock, held by another process: every writer on the host waits.
          'table-lock': async (ms) => {
            const db = new Database(file, { timeout: 5000 });
            db.exec('BEGIN IMMEDIATE');
            await sleep(ms);
            db.exec('ROLLBACK');
            db.close();
          },
        },
        effects: async () => read(),
        close: async () => rmSync(dir, { recursive: true, force: true }),
      };
    },
  },
  postgres: { modes: ['lease', 'atomic'], open: () => sqlOnPostgres('postgres', {}) },
  pgbouncer: {
    modes: ['lease', 'atomic'],
    open: () => sqlOnPostgres('postgres', { pooling: 'transaction' }, true),
  },
  drizzle: { modes: ['lease', 'atomic'], open: () => sqlOnPostgres('drizzle', {}) },
  mysql: {
    modes: ['lease', 'atomic'],
    async open() {
      const { url: serverUrl, restart } = await privateMariadb();
      const name = uniqueName();
      // A connection per use: a restart ends every connection.
      const asAdmin = async (use) => {
        const admin = await mysql.createConnection(serverUrl);
        try {
          return await use(admin);
        } finally {
          await admin.end().catch(() => {});
        }
      };
      await asAdmin((admin) => admin.query(`CREATE DATABASE \`${name}\``));
      const proxy = await startTcpProxy({ targetPort: Number(new URL(serverUrl).port) });
      const direct = withPort(serverUrl, new URL(serverUrl).port, name);
      return {
        env: { STORE: 'mysql', STORE_URL: withPort(serverUrl, proxy.port, name) },
        proxy,
        faults: {
          'connection-kill': () =>
            asAdmin(async (admin) => {
              const [rows] = await admin.query('SELECT id FROM information_schema.processlist WHERE db = ?', [
                name,
              ]);
              for (const { id } of rows) await admin.query(`KILL ${Number(id)}`).catch(() => {});
              return rows.length;
            }),
          'table-lock': async (ms) => {
            const locker = await mysql.createConnection(direct);
            await locker.query('LOCK TABLES torture_effect WRITE');
            await sleep(ms);
            await locker.query('UNLOCK TABLES');
            await locker.end();
          },
          // SIGKILL, then InnoDB's crash recovery.
          'db-restart': () => restart(RESTART_PAUSE_MS),
        },
        async effects() {
          const reader = await mysql.createConnection(direct);
          const [rows] = await reader.query(`SELECT ${EFFECT_COLUMNS} FROM torture_effect`);
          await reader.end();
          return asEffects(rows);
        },
        async close() {
          await proxy.close();
          await asAdmin((admin) => admin.query(`DROP DATABASE IF EXISTS \`${name}\``));
        },
      };
    },
  },
  redis: { modes: ['lease'], open: () => redisTarget(false) },
  'redis-cluster': { modes: ['lease'], open: () => redisTarget(true) },
};

/** PostgreSQL (directly or behind a pgbouncer of the run's own) for the key store and the effects. */
async function sqlOnPostgres(store, storeOptions, bounced = false) {
  const database = await postgresDatabase();
  const bouncer = bounced
    ? await startPgBouncer(database.adminUrl, { port: await freeLoopbackPort(), poolSize: 8 })
    : undefined;
  const proxy = await startTcpProxy({ targetPort: bouncer?.port ?? Number(new URL(database.adminUrl).port) });
  return {
    env: {
      STORE: store,
      STORE_URL: withPort(database.url, proxy.port),
      STORE_OPTIONS: JSON.stringify(storeOptions),
    },
    proxy,
    faults: {
      'connection-kill': database.killConnections,
      'table-lock': database.lockEffects,
      'db-restart': database.restart,
    },
    effects: database.effects,
    async close() {
      await proxy.close();
      await bouncer?.stop();
      await database.drop();
    },
  };
}

/**
 * The run's Redis (through the run's proxy) or its Redis Cluster for keys; effects in PostgreSQL.
 * The Redis is restarted by the schedule, the cluster loses a master.
 */
async function redisTarget(cluster) {
  const database = await postgresDatabase();
  const prefix = `${uniqueName()}:`;
  const redis = cluster ? undefined : await privateRedis();
  const redisCluster = cluster ? await privateRedisCluster() : undefined;
  const proxy = cluster ? undefined : await startTcpProxy({ targetPort: Number(new URL(redis.url).port) });
  const admin = cluster ? undefined : new Redis(redis.url);
  admin?.on('error', () => {});
  const storeUrl = cluster
    ? redisCluster.nodes.join(',')
    : `${withPort(redis.url, proxy.port)}?connectionName=${encodeURIComponent(prefix)}`;
  return {
    env: {
      STORE: cluster ? 'redis-cluster' : 'redis',
      STORE_URL: storeUrl,
      EFFECT_URL: database.url,
      STORE_OPTIONS: JSON.stringify({ prefix }),
    },
    proxy,
    faults: {
      'table-lock': database.lockEffects,
      ...(cluster
        ? { 'master-kill': redisCluster.killMaster }
        : {
            // SIGKILL; the append-only file gives the keys back.
            'db-restart': () => redis.restart(RESTART_PAUSE_MS),
            // Only this run's connections (named by the prefix).
            'connection-kill': async () => {
              const clients = String(await admin.client('LIST')).split('\n');
              const ids = clients
                .filter((line) => line.includes(` name=${prefix} `))
                .map((line) => /id=(\d+)/.exec(line)[1]);
              for (const id of ids) await admin.client('KILL', 'ID', id).catch(() => {});
              return ids.length;
            },
          }),
    },
    effects: database.effects,
    async close() {
      await proxy?.close();
      const keys = cluster ? [] : await admin.keys(`${prefix}*`);
      if (keys.length > 0) await admin.del(...keys);
      if (cluster) await deleteClusterKeys(redisCluster.nodes, prefix);
      admin?.disconnect();
      await database.drop();
    },
  };
}

async function deleteClusterKeys(nodes, prefix) {
  for (const node of nodes) {
    const [host, port] = node.split(':');
    const client = new Redis({ host, port: Number(port) });
    const role = await client.role().catch(() => ['replica']);
    if (role[0] === 'master') {
      const keys = await client.keys(`${prefix}*`);
      for (const key of keys) await client.del(key).catch(() => {});
    }
    client.disconnect();
  }
}

async function freeLoopbackPort() {
  const { freePort } = await import('../../bench/lib/proc.js');
  return freePort();
}
