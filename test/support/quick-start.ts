import { expect } from 'vitest';

/** Bodies a careful quick start refuses with a 400 of its own, before any order is taken. */
export const BAD_BODIES = [
  { name: 'invalid JSON', contentType: 'application/json', body: '{"item":' },
  { name: 'an empty body', contentType: 'application/json', body: '' },
  { name: 'text/plain', contentType: 'text/plain', body: 'hello' },
] as const;

/**
 * A quick start's promise, at `url`: 400 without a key; 400 with a JSON error for each bad body,
 * which leaves the order counter and the key alone (a 400 is not stored, so the corrected request
 * runs under the same key); then 201 for the first good order, and its retry replayed.
 */
export async function checkQuickStart(url: string): Promise<void> {
  const order = (key?: string, contentType = 'application/json', body = JSON.stringify({ item: 'book' })) =>
    fetch(`${url}/orders`, {
      method: 'POST',
      headers: { 'content-type': contentType, ...(key ? { 'idempotency-key': key } : {}) },
      body,
    });
  expect((await order()).status).toBe(400);
  for (const bad of BAD_BODIES) {
    const refused = await order('order-1', bad.contentType, bad.body);
    expect(refused.status, bad.name).toBe(400);
    expect(refused.headers.get('content-type'), bad.name).toMatch(/^application\/json/);
    expect(await refused.json(), bad.name).toMatchObject({ error: expect.any(String) });
  }
  const first = await order('order-1');
  expect(first.status).toBe(201);
  expect(first.headers.get('location')).toBe('/orders/1');
  const body = await first.json();
  expect(body).toEqual({ id: 1, order: { item: 'book' }, key: 'order-1' });
  const retry = await order('order-1');
  expect(retry.status).toBe(201);
  expect(retry.headers.get('idempotency-replayed')).toBe('true');
  expect(retry.headers.get('location')).toBe('/orders/1');
  expect(await retry.json()).toEqual(body);
}
