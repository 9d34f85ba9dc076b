import Fastify from 'fastify';
import { idempotency } from 'retrysafe/fastify';
import { sqliteStore } from 'retrysafe/sqlite';

const app = Fastify();
await app.register(idempotency, { store: sqliteStore({ filename: 'idempotency.db' }) });
let orders = 0;

app.post('/orders', { config: { idempotency: { required: true } } }, async (request, reply) => {
  const id = ++orders;
  reply.code(201).header('location', `/orders/${id}`);
  return { id, item: request.body.item, key: request.idempotency.key };
});

await app.listen({ port: Number(process.env.PORT ?? 3000), host: process.env.HOST ?? '127.0.0.1' });
console.log(`listening on http://localhost:${app.server.address().port}`);
