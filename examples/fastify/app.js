import Fastify from 'fastify';
import { idempotency } from 'retrysafe/fastify';
import { sqliteStore } from 'retrysafe/sqlite';

const app = Fastify();
app.register(idempotency, { store: sqliteStore({ url: 'idempotency.db', migrate: true }) });
let orders = 0;

// Fastify answers 400 itself to a body that is not JSON or not an order.
const schema = { body: { type: 'object', required: ['item'], properties: { item: { type: 'string' } } } };

app.post('/orders', { schema, config: { idempotency: { required: true } } }, async (request, reply) => {
  const id = ++orders;
  reply.code(201).header('location', `/orders/${id}`);
  return { id, order: request.body, key: request.idempotency?.key };
});

const port = Number(process.env.PORT ?? 3000);
await app.listen({ port, host: process.env.HOST ?? '127.0.0.1' });
console.log(`listening on http://localhost:${port}`);
