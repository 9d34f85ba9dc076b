import { durableObjectStore } from 'retrysafe/cloudflare';
import { idempotency } from 'retrysafe/fetch';

// The Durable Object that holds the idempotency records: bound as IDEMPOTENCY (wrangler.jsonc).
export { IdempotencyObject } from 'retrysafe/cloudflare';

/** The orders, in a Durable Object of their own (bound as ORDERS) so every isolate sees them all. */
export class Orders {
  constructor(ctx) {
    this.sql = ctx.storage.sql;
    this.sql.exec('CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)');
  }

  async fetch(request) {
    if (request.method === 'POST') {
      const { item } = await request.json();
      return Response.json(
        this.sql.exec('INSERT INTO orders (item) VALUES (?) RETURNING id, item', item).one(),
      );
    }
    return Response.json(this.sql.exec('SELECT id, item FROM orders ORDER BY id').toArray());
  }
}

const orders = (env) => env.ORDERS.get(env.ORDERS.idFromName('orders'));

async function createOrder(request, env) {
  const body = await request.json().catch(() => undefined);
  if (typeof body?.item !== 'string') {
    return Response.json({ error: 'validation', field: 'item' }, { status: 400 });
  }
  const created = await orders(env).fetch('https://orders/', {
    method: 'POST',
    body: JSON.stringify({ item: body.item }),
  });
  return Response.json(await created.json(), { status: 201 });
}

// Made on the first request: `env` (the bindings) arrives with it.
let guardedCreateOrder;

export default {
  async fetch(request, env) {
    if (new URL(request.url).pathname !== '/orders') {
      return Response.json({ error: 'path_not_found' }, { status: 404 });
    }
    if (request.method === 'GET') return orders(env).fetch('https://orders/');
    guardedCreateOrder ??= idempotency({
      store: durableObjectStore({ namespace: env.IDEMPOTENCY }),
      required: true,
    })(createOrder);
    return guardedCreateOrder(request, env);
  },
};
