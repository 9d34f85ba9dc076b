// One app process of the torture run: node:http with retrysafe/node, `POST /orders {item, holdMs}`
// writing one effect row. Started (and SIGKILLed, and restarted) by scripts/torture/run.js.
//
// Environment: STORE (sqlite | postgres | mysql | redis | redis-cluster | drizzle), MODE (lease |
// atomic), STORE_URL (the key store; SQLite: a file), STORE_OPTIONS (JSON, extra store options),
// EFFECT_URL (where effects land: the same database, or PostgreSQL for the Redis stores), LEASE,
// PORT. Prints `listening <port>` once it serves.
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { idempotency } from 'retrysafe/node';

const STORE = process.env.STORE;
const MODE = process.env.MODE ?? 'lease';
const STORE_URL = process.env.STORE_URL;
const EFFECT_URL = process.env.EFFECT_URL ?? STORE_URL;
const STORE_OPTIONS = JSON.parse(process.env.STORE_OPTIONS ?? '{}');

/**
 * The effect: one row per execution of an order, or, in lease mode, one row per intent (a unique
 * column from `downstreamKey`, as docs/guarantees.md asks of lease-mode effects), its `runs`
 * counting how many times a handler wrote it. In atomic mode the row has no intent: the store's
 * transaction alone must keep it to one.
 */
const EFFECT_DDL = {
  postgres: `CREATE TABLE IF NOT EXISTS torture_effect (id bigserial PRIMARY KEY, scope text NOT NULL,
    idem_key text NOT NULL, item text NOT NULL, intent text UNIQUE, pid int NOT NULL, runs int NOT NULL DEFAULT 1)`,
  sqlite: `CREATE TABLE IF NOT EXISTS torture_effect (id INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL,
    idem_key TEXT NOT NULL, item TEXT NOT NULL, intent TEXT UNIQUE, pid INTEGER NOT NULL, runs INTEGER NOT NULL DEFAULT 1)`,
  mysql: `CREATE TABLE IF NOT EXISTS torture_effect (id BIGINT AUTO_INCREMENT PRIMARY KEY, scope VARCHAR(1100) NOT NULL,
    idem_key VARCHAR(255) NOT NULL, item VARCHAR(255) NOT NULL, intent VARCHAR(255) UNIQUE, pid INT NOT NULL,
    runs INT NOT NULL DEFAULT 1)`,
};
const UPSERT = `INSERT INTO torture_effect (scope, idem_key, item, intent, pid) VALUES (?, ?, ?, ?, ?)
  ON CONFLICT (intent) DO UPDATE SET runs = torture_effect.runs + 1 RETURNING id, item`;
const numbered = (text) => {
  let n = 0;
  return text.replace(/\?/g, () => `$${++n}`);
};

/** `{ store, write(row, tx) }`: the key store and how an effect row is written (on `tx` when given). */
async function open() {
  if (STORE === 'sqlite') {
    const { sqliteStore } = await import('retrysafe/sqlite');
    const store = sqliteStore({ url: STORE_URL, migrate: true, ...STORE_OPTIONS });
    await store.transaction((db) => db.exec(EFFECT_DDL.sqlite));
    const write = (row, db) => db.prepare(UPSERT).get(...row);
    return { store, write: (row, tx) => (tx ? write(row, tx) : store.transaction((db) => write(row, db))) };
  }
  if (STORE === 'mysql') {
    const { mysqlStore } = await import('retrysafe/mysql');
    const mysql = await import('mysql2/promise');
    const pool = mysql.createPool({ uri: EFFECT_URL, connectionLimit: 4 });
    await pool.query(EFFECT_DDL.mysql);
    const store = mysqlStore({ url: STORE_URL, migrate: true, ...STORE_OPTIONS });
    // MariaDB has no RETURNING on an upsert: LAST_INSERT_ID(id) names the row, new or kept.
    const write = async (row, connection) => {
      await connection.query(
        `INSERT INTO torture_effect (scope, idem_key, item, intent, pid) VALUES (?, ?, ?, ?, ?)
         ON DUPLICATE KEY UPDATE runs = runs + 1, id = LAST_INSERT_ID(id)`,
        row,
      );
      const [rows] = await connection.query(
        'SELECT id, item FROM torture_effect WHERE id = LAST_INSERT_ID()',
      );
      return rows[0];
    };
    return {
      store,
      async write(row, tx) {
        if (tx) return write(row, tx);
        const connection = await pool.getConnection();
        try {
          return await write(row, connection);
        } finally {
          connection.release();
        }
      },
    };
  }
  const pg = (await import('pg')).default;
  const pool = new pg.Pool({ connectionString: EFFECT_URL, max: 4 });
  pool.on('error', () => {});
  // A client Drizzle checks out for a transaction (atomic mode: the whole request) has no 'error'
  // listener, and one whose connection ends meanwhile would crash the process (drizzle-orm#3908);
  // its queries reject all the same. docs/reference.md ("With your ORM") asks this of apps.
  pool.on('connect', (client) => client.on('error', () => {}));
  await pool.query(EFFECT_DDL.postgres);
  const writeOn = async (row, client) => (await client.query(numbered(UPSERT), row)).rows[0];
  if (STORE === 'drizzle') {
    const { drizzle } = await import('drizzle-orm/node-postgres');
    const { sql } = await import('drizzle-orm');
    const { drizzleStore } = await import('retrysafe/drizzle');
    const db = drizzle(pool);
    const store = drizzleStore(db, { migrate: true, ...STORE_OPTIONS });
    // On Drizzle's transaction (`idem.tx`) in atomic mode, through Drizzle's own `execute`.
    const write = async ([scope, key, item, intent, pid], on) =>
      (
        await on.execute(sql`INSERT INTO torture_effect (scope, idem_key, item, intent, pid)
          VALUES (${scope}, ${key}, ${item}, ${intent}, ${pid})
          ON CONFLICT (intent) DO UPDATE SET runs = torture_effect.runs + 1 RETURNING id, item`)
      ).rows[0];
    return { store, write: (row, tx) => write(row, tx ?? db) };
  }
  if (STORE === 'postgres') {
    const { postgresStore } = await import('retrysafe/postgres');
    const store = postgresStore({ url: STORE_URL, ...STORE_OPTIONS });
    await store.migrate();
    return { store, write: (row, tx) => writeOn(row, tx ?? pool) };
  }
  const { redisStore } = await import('retrysafe/redis');
  const store =
    STORE === 'redis-cluster'
      ? redisStore({ clusterNodes: STORE_URL.split(','), ...STORE_OPTIONS })
      : redisStore({ url: STORE_URL, ...STORE_OPTIONS });
  return { store, write: (row) => writeOn(row, pool) };
}

const { store, write } = await open();
// The scope is the credential as sent, so the run's history and the effect rows name it alike.
const guard = idempotency({
  store,
  mode: MODE,
  lease: process.env.LEASE ?? '10s',
  required: true,
  scope: (req) => req.headers.authorization ?? '',
});

const json = (res, status, value, headers = {}) =>
  res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(value));

const server = http.createServer(
  guard(async function order(req, res, idem) {
    if (req.method !== 'POST' || req.url !== '/orders') return json(res, 404, { error: 'path_not_found' });
    let body;
    try {
      body = JSON.parse(String(req.body));
    } catch {}
    if (typeof body?.item !== 'string') return json(res, 400, { error: 'validation', field: 'item' });
    // A handler longer than its lease: the lease must follow it (renewals), never lapse under it.
    if (body.holdMs > 0) await sleep(body.holdMs);
    const intent = MODE === 'lease' ? idem.downstreamKey(`order ${idem.fingerprint}`) : null;
    let effect;
    try {
      effect = await write([idem.scope, idem.key, body.item, intent, process.pid], idem.tx);
    } catch (error) {
      // A 5xx releases the key (lease) or rolls back (atomic): the client's retry runs it again.
      const message = String(error?.message ?? error);
      return json(res, 503, { error: 'database_unavailable', message }, { 'retry-after': '1' });
    }
    json(res, 201, { id: String(effect.id), item: effect.item });
  }),
);
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () =>
  console.log(`listening ${server.address().port}`),
);
