import { createServer } from 'node:http';
import { initTRPC } from '@trpc/server';
import { createHTTPHandler } from '@trpc/server/adapters/standalone';
import { sqliteStore } from 'retrysafe/sqlite';
import { idempotency } from 'retrysafe/trpc';

const t = initTRPC.context().create();
const orders = [];

const router = t.router({
  createOrder: t.procedure
    .use(idempotency({ store: sqliteStore({ url: 'idempotency.db', migrate: true }) }))
    .input((input) => {
      if (typeof input?.item !== 'string') throw new Error('send an order with an item');
      return { item: input.item };
    })
    .mutation(({ input }) => {
      const order = { id: orders.length + 1, item: input.item };
      orders.push(order);
      return order;
    }),
});

// tRPC at /trpc/…; its context hands the middleware the request, whose headers carry the key.
const trpc = createHTTPHandler({ router, basePath: '/trpc/', createContext: ({ req }) => ({ req }) });
const server = createServer((req, res) => {
  if (req.url?.startsWith('/trpc/')) return trpc(req, res);
  if (req.method === 'GET' && req.url === '/orders') {
    res.setHeader('content-type', 'application/json');
    return res.end(JSON.stringify(orders));
  }
  res.statusCode = 404;
  res.end();
});
const port = Number(process.env.PORT ?? 3000);
server.listen(port, process.env.HOST ?? '127.0.0.1', () =>
  console.log(`listening on http://localhost:${port}`),
);
