import { join } from 'node:path';
import type { Miniflare } from 'miniflare';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readWranglerConfig, startWorker, workerdSupported } from './support/workerd.js';

/** examples/workers, as `wrangler dev` would run it: its wrangler.jsonc, on the real workerd runtime. */
const example = join(import.meta.dirname, '../examples/workers');
let worker: Miniflare | undefined;

const post = (key: string | undefined, body: string) =>
  worker!.dispatchFetch('http://localhost/orders', {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key !== undefined && { 'idempotency-key': key }) },
    body,
  });

const orders = async () =>
  (await (await worker!.dispatchFetch('http://localhost/orders')).json()) as unknown[];

describe.runIf(workerdSupported)('examples/workers on workerd', () => {
  beforeAll(async () => {
    worker = await startWorker(
      join(example, 'worker.js'),
      readWranglerConfig(join(example, 'wrangler.jsonc')),
    );
  });
  afterAll(() => worker?.dispose());

  it('50 concurrent duplicates make one order and all get its answer; another item under the key is 409', async () => {
    const answers = await Promise.all(
      Array.from({ length: 50 }, () => post('order-1', JSON.stringify({ item: 'book' }))),
    );
    const bodies = await Promise.all(answers.map((answer) => answer.text()));
    expect(answers.map((answer) => answer.status)).toEqual(Array(50).fill(201));
    expect(new Set(bodies)).toEqual(new Set([bodies[0]]));
    const order = JSON.parse(bodies[0]!) as { id: number; item: string };
    expect(order.item).toBe('book');
    expect(answers.filter((answer) => answer.headers.get('idempotency-replayed') === 'true')).toHaveLength(
      49,
    );

    const conflict = await post('order-1', JSON.stringify({ item: 'lamp' }));
    expect(conflict.status).toBe(409);
    expect(await conflict.json()).toMatchObject({ error: 'key_conflict' });
    expect(await orders()).toEqual([order]);
  });

  it('a new key is a new order; no key or a bad body is a 400 that stores nothing', async () => {
    const before = await orders();
    const missing = await post(undefined, JSON.stringify({ item: 'pen' }));
    expect(missing.status).toBe(400);
    await missing.body?.cancel();
    const invalid = await post('order-2', JSON.stringify({ item: 7 }));
    expect(invalid.status).toBe(400);
    expect(await invalid.json()).toEqual({ error: 'validation', field: 'item' });
    expect(await orders()).toEqual(before);

    const created = await post('order-2', JSON.stringify({ item: 'pen' }));
    expect(created.status).toBe(201);
    expect(await created.json()).toMatchObject({ item: 'pen' });
    expect(await orders()).toHaveLength(before.length + 1);
  });
});
