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
  const order = await request.json().catch(() => undefined);
  // A 400 is not stored: the corrected request runs under the same key.
  if (typeof order?.item !== 'string')
    return Response.json({ error: 'send a JSON order with an item' }, { status: 400 });
  const id = ++orders;
  return Response.json(
    { id, order, key: idempotencyOf(request)?.key },
    { status: 201, headers: { location: `/orders/${id}` } },
  );
});
