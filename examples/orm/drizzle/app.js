// POST /orders with Drizzle in atomic mode: the key, the order and the saved answer commit in one
// Drizzle transaction. `DATABASE_URL` names a PostgreSQL database; `PORT` the port.
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { pgTable, serial, text } from 'drizzle-orm/pg-core';
import { drizzleStore } from 'retrysafe/drizzle';
import { idempotency } from 'retrysafe/node';

const orders = pgTable('drizzle_orders', { id: serial('id').primaryKey(), item: text('item').notNull() });
const db = drizzle(process.env.DATABASE_URL);
await db.execute(sql`CREATE TABLE IF NOT EXISTS drizzle_orders (id serial PRIMARY KEY, item text NOT NULL)`);
const store = drizzleStore(db, { table: 'drizzle_idempotency_keys', migrate: true });
const guard = idempotency({ store, mode: 'atomic' });

const json = (res, status, value) =>
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(value));

const server = http.createServer(
  guard(async (req, res, idem) => {
    if (req.url !== '/orders') return json(res, 404, { error: 'not_found' });
    if (req.method === 'GET') return json(res, 200, await db.select().from(orders).orderBy(orders.id));
    let item;
    try {
      item = JSON.parse(String(req.body)).item;
    } catch {}
    if (typeof item !== 'string') return json(res, 400, { error: 'send {"item": "…"}' });
    // ctx.tx is Drizzle's transaction; without a key the order is written on its own.
    const write = async (tx) => {
      if (item === 'nested-then-fail') {
        // Drizzle's nested transaction: a savepoint, released into the outer transaction.
        await tx.transaction((nested) => nested.insert(orders).values({ item }));
        throw new Error('failed after the nested transaction');
      }
      // Ends the operation's transaction under retrysafe: it notices, and answers 500.
      if (item === 'raw-commit') await tx.execute(sql`COMMIT`);
      const [order] = await tx.insert(orders).values({ item }).returning();
      if (item === 'fail-after-write') throw new Error('failed after writing the order');
      if (item === 'slow') await sleep(3000);
      return order;
    };
    const order = idem ? await write(idem.tx) : await db.transaction(write);
    json(res, 201, order);
  }),
);
const port = Number(process.env.PORT ?? 3000);
server.listen(port, '127.0.0.1', () => console.log(`listening on http://127.0.0.1:${port}`));
