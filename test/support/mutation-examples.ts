import { expect } from 'vitest';

// The contracts of the mutation examples (examples/trpc, examples/graphql) over plain HTTP: shared
// by their adapter tests and the packed-tarball test, which runs them in a user's project.

interface Order {
  id: number;
  item: string;
}

const json = { 'content-type': 'application/json' };
const orders = async (base: string) => (await (await fetch(`${base}/orders`)).json()) as Order[];

/**
 * examples/trpc/app.js at `base`: `POST /trpc/createOrder` with `{item}` as the body; the same key
 * twice makes one order and answers the same output; another input under the key is a tRPC error
 * with HTTP 409; a bad input is a 400 that leaves the key free.
 */
export async function checkTrpcExample(base: string): Promise<void> {
  const post = (item: unknown, key?: string) =>
    fetch(`${base}/trpc/createOrder`, {
      method: 'POST',
      headers: { ...json, ...(key ? { 'idempotency-key': key } : {}) },
      body: JSON.stringify({ item }),
      signal: AbortSignal.timeout(15_000),
    });
  expect((await post(1, 'order-1')).status).toBe(400);
  const first = await post('book', 'order-1');
  expect(first.status).toBe(200);
  const body = (await first.json()) as { result: { data: Order } };
  expect(body.result.data).toEqual({ id: 1, item: 'book' });
  const retry = await post('book', 'order-1');
  expect(retry.status).toBe(200);
  expect(await retry.json()).toEqual(body);
  const conflict = await post('pen', 'order-1');
  expect(conflict.status).toBe(409);
  expect(await conflict.json()).toMatchObject({ error: { data: { code: 'CONFLICT', httpStatus: 409 } } });
  expect(await orders(base)).toEqual([body.result.data]);
}

/**
 * examples/graphql/app.js at `base`: `POST /graphql` with `createOrder(item:)` and an
 * Idempotency-Key header; the same key twice makes one order and answers the same `data`; another
 * item under the key is an error with `extensions.code` `KEY_CONFLICT` and no order.
 */
export async function checkGraphqlExample(base: string): Promise<void> {
  const post = (item: string, key: string) =>
    fetch(`${base}/graphql`, {
      method: 'POST',
      headers: { ...json, 'idempotency-key': key },
      body: JSON.stringify({ query: `mutation { createOrder(item: ${JSON.stringify(item)}) { id item } }` }),
      signal: AbortSignal.timeout(15_000),
    });
  const first = await post('book', 'order-1');
  expect(first.status).toBe(200);
  const body = (await first.json()) as { data: { createOrder: Order } };
  expect(body).toEqual({ data: { createOrder: { id: 1, item: 'book' } } });
  expect(await (await post('book', 'order-1')).json()).toEqual(body);
  const conflict = (await (await post('pen', 'order-1')).json()) as {
    data: unknown;
    errors: Array<{ extensions: { code: string } }>;
  };
  expect(conflict.data).toBeNull();
  expect(conflict.errors.map((error) => error.extensions.code)).toEqual(['KEY_CONFLICT']);
  expect(await orders(base)).toEqual([body.data.createOrder]);
}
