import { serve } from '@hono/node-server';
import { Hono } from 'hono';
import { idempotency } from 'retrysafe/hono';
import { sqliteStore } from 'retrysafe/sqlite';

const app = new Hono();
let orders = 0;
const store = sqliteStore({ url: 'idempotency.db', migrate: true });
app.use('/orders', idempotency({ store, required: true }));
app.post('/orders', async (c) => {
  const order = await c.req.json().catch(() => undefined);
  if (typeof order?.item !== 'string') return c.json({ error: 'send a JSON order with an item' }, 400);
  const id = ++orders;
  return c.json({ id, order, key: c.get('idempotency')?.key }, 201, { location: `/orders/${id}` });
});

const port = Number(process.env.PORT ?? 3000);
serve({ fetch: app.fetch, port, hostname: process.env.HOST ?? '127.0.0.1' }, () =>
  console.log(`listening on http://localhost:${port}`),
);
