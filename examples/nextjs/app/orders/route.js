import { idempotency, idempotencyOf } from 'retrysafe/fetch';
import { memoryStore } from 'retrysafe/memory';
import { addOrder, allOrders } from '../orders.js';

// An App Router route handler; keys in this process's memory (several instances: retrysafe/redis).
const guard = idempotency({ store: memoryStore(), required: true });

export const GET = () => Response.json(allOrders());
export const POST = guard(async (request) => {
  const body = await request.json().catch(() => undefined);
  if (typeof body?.item !== 'string')
    return Response.json({ error: 'send a JSON order with an item' }, { status: 400 });
  const { id, order } = addOrder({ order: body });
  return Response.json(
    { id, order, key: idempotencyOf(request)?.key },
    { status: 201, headers: { location: `/orders/${id}` } },
  );
});
