import { idempotency, idempotencyOf } from 'retrysafe/fetch';
import { memoryStore } from 'retrysafe/memory';
import { addOrder, allOrders } from '../orders.js';

// A Next.js App Router route handler (Node.js runtime, the default). The memory store holds keys
// in this `next start` process; with several instances, use retrysafe/redis or retrysafe/postgres.
const guard = idempotency({ store: memoryStore(), required: true });

export const GET = () => Response.json(allOrders());
export const POST = guard(async (request) => {
  const { id, order } = addOrder({ order: await request.json() });
  return Response.json(
    { id, order, key: idempotencyOf(request)?.key },
    { status: 201, headers: { location: `/orders/${id}` } },
  );
});
