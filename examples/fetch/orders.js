import { idempotency, idempotencyOf } from 'retrysafe/fetch';
import { memoryStore } from 'retrysafe/memory';

// One Web-standard handler, served as is by Bun (bun.js), Deno (deno.js) or any runtime whose
// server takes `(request) => Response`. With REDIS_URL set, keys live in Redis (ioredis), shared
// by every instance; otherwise in this process's memory.
const store = process.env.REDIS_URL
  ? (await import('retrysafe/redis')).redisStore({ url: process.env.REDIS_URL })
  : memoryStore();
const guard = idempotency({ store, required: true });
let orders = 0;

export const handleOrder = guard(async (request) => {
  const id = ++orders;
  const order = await request.json();
  return Response.json(
    { id, order, key: idempotencyOf(request)?.key },
    { status: 201, headers: { location: `/orders/${id}` } },
  );
});
