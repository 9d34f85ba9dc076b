import { afterAll, describe, expect, it } from 'vitest';
import { idempotency, idempotencyOf } from '../src/adapters/fetch.js';
import { memoryStore } from '../src/stores/memory.js';
import { describeAdapterConformance } from '../src/testing/adapter-suite.js';
import { fetchAdapter } from './conformance/apps/fetch.js';
import { memory, postgres, redis, sqlite } from './support/store-factories.js';

describeAdapterConformance(fetchAdapter, [memory, sqlite, postgres, redis]);

describe('fetch specifics', () => {
  const store = memoryStore();
  afterAll(() => store.close());

  const post = (body: BodyInit, key?: string, headers: Record<string, string> = {}) =>
    new Request('http://app.test/orders', {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}), ...headers },
      body,
      duplex: 'half',
    } as RequestInit);

  it('the handler gets the same Request, its body unread, and the rest of its arguments', async () => {
    let seen: { same: boolean; body: unknown; rest: unknown[]; key?: string } | undefined;
    const request = post('{"isbn":"1"}', 'same-1');
    const guard = idempotency({ store });
    const handler = guard(async (req: Request, route: { params: Promise<{ id: string }> }, extra: number) => {
      seen = {
        same: req === request,
        body: await req.json(),
        rest: [await route.params, extra],
        key: idempotencyOf(req)?.key,
      };
      return Response.json({ ok: true }, { status: 201 });
    });
    const reply = await handler(request, { params: Promise.resolve({ id: '7' }) }, 42);
    expect(reply.status).toBe(201);
    expect(seen).toEqual({ same: true, body: { isbn: '1' }, rest: [{ id: '7' }, 42], key: 'same-1' });
  });

  it('a streamed body over maxBodyBytes without Content-Length: 413 before the handler runs', async () => {
    let calls = 0;
    const handler = idempotency({ store, maxBodyBytes: 1000 })(async () => {
      calls++;
      return new Response('made');
    });
    const chunk = new Uint8Array(600).fill(0x61);
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < 3; i++) controller.enqueue(chunk);
        controller.close();
      },
    });
    const reply = await handler(post(body, 'big-1'));
    expect(reply.status).toBe(413);
    expect(await reply.json()).toMatchObject({ error: 'body_too_large' });
    expect(calls).toBe(0);
  });

  it('keyless and unguarded requests reach the handler untouched, with no context', async () => {
    const seen: Array<[boolean, unknown]> = [];
    const handler = idempotency({ store })(async (req: Request) => {
      seen.push([req.bodyUsed, idempotencyOf(req)]);
      return new Response(req.method);
    });
    await handler(post('{}'));
    await handler(new Request('http://app.test/orders', { headers: { 'idempotency-key': 'get-1' } }));
    expect(seen).toEqual([
      [false, undefined],
      [false, undefined],
    ]);
  });

  it('an error the handler throws is thrown on, and the key released for the retry', async () => {
    let calls = 0;
    const handler = idempotency({ store })(async () => {
      calls++;
      if (calls === 1) throw new Error('downstream down');
      return Response.json({ calls }, { status: 201 });
    });
    await expect(handler(post('{}', 'throw-1'))).rejects.toThrow('downstream down');
    const retry = await handler(post('{}', 'throw-1'));
    expect(retry.status).toBe(201);
    const replay = await handler(post('{}', 'throw-1'));
    expect(replay.headers.get('idempotency-replayed')).toBe('true');
    expect(await replay.json()).toEqual({ calls: 2 });
  });
});
