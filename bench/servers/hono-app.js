// One Hono app (@hono/node-server), one handler that writes the order of bench/servers/work.js in
// SQLite (SQLITE_FILE); CONTENDER picks what stands in front of it:
//   hono-bare              the order INSERTed on the app's own connection (one autocommit write)
//   hono-retrysafe-sqlite  retrysafe/hono over sqliteStore in atomic mode: the order INSERTed on
//                          ctx.tx, in the one transaction of the claim and the saved answer
// Started in its own process by bench/run.js; reports its port over IPC.
import { serve } from '@hono/node-server';
import Database from 'better-sqlite3';
import { Hono } from 'hono';
import { serveCommands } from '../lib/proc.js';
import { delay, stats, work } from './work.js';

const CONTENDER = process.env.CONTENDER ?? 'hono-bare';
const ORDERS = 'CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, item TEXT, qty INTEGER)';

/** The connection the handler writes on, and the guard in front of it (none when bare). */
async function contender() {
  if (CONTENDER === 'hono-bare') {
    const db = new Database(process.env.SQLITE_FILE);
    db.pragma('journal_mode = WAL');
    return { db, guard: undefined };
  }
  if (CONTENDER === 'hono-retrysafe-sqlite') {
    const { idempotency } = await import('retrysafe/hono');
    const { sqliteStore } = await import('retrysafe/sqlite');
    const store = sqliteStore({ url: process.env.SQLITE_FILE, migrate: true });
    return { db: store.database, guard: idempotency({ store, mode: 'atomic' }) };
  }
  throw new Error(`unknown CONTENDER ${CONTENDER}`);
}

try {
  const { db, guard } = await contender();
  db.exec(ORDERS);
  const insert = db.prepare('INSERT INTO orders (id, item, qty) VALUES (@id, @item, @qty)');
  const app = new Hono();
  if (guard) app.use('/orders', guard);
  app.post('/orders', async (c) => {
    const order = await work(await c.req.json());
    // Guarded, this is ctx.tx: the store's connection, inside the request's open transaction.
    insert.run({ id: order.id, item: order.item ?? null, qty: order.qty ?? null });
    return c.json(order, 201);
  });
  const server = serve({ fetch: app.fetch, port: 0, hostname: '127.0.0.1' }, (info) =>
    process.send?.({ ready: info.port }),
  );
  serveCommands({ stats, delay });
  process.once('SIGTERM', () => server.close(() => process.exit(0)));
} catch (error) {
  process.send?.({ failed: String(error?.message ?? error) });
  process.exit(1);
}
