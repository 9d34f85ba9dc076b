import { mkdtempSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createTRPCClient, httpBatchLink, httpLink, TRPCClientError } from '@trpc/client';
import { initTRPC, TRPCError } from '@trpc/server';
import { fetchRequestHandler } from '@trpc/server/adapters/fetch';
import { createHTTPServer } from '@trpc/server/adapters/standalone';
import { afterAll, describe, expect, it } from 'vitest';
import { type IdempotencyCtx, idempotency, type TrpcIdempotencyOptions } from '../src/adapters/trpc.js';
import { ConfigError } from '../src/core/index.js';
import { memoryStore } from '../src/stores/memory.js';
import { checkTrpcExample } from './support/mutation-examples.js';
import { serveOneReplay } from './support/quick-start.js';

const root = join(import.meta.dirname, '..');

interface Order {
  id: number;
  item: string;
  key?: string;
}

/** A deferred: a promise and the function that settles it, for a resolver held mid-run. */
function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

const servers: Array<{ close(): void }> = [];
afterAll(() => {
  for (const server of servers) server.close();
});

/**
 * A tRPC app on tRPC's own HTTP server with a guarded `createOrder`, the orders it made, and a
 * client whose mutations send `context.key` as the Idempotency-Key header.
 */
async function startApp(
  options: Partial<TrpcIdempotencyOptions> = {},
  hooks: { hold?: Promise<void>; entered?: () => void; fail?: () => boolean } = {},
) {
  const t = initTRPC.context<{ req: { headers: Record<string, string | string[] | undefined> } }>().create();
  const orders: Order[] = [];
  const guarded = t.procedure.use(idempotency({ store: memoryStore(), ...options }));
  const router = t.router({
    createOrder: guarded
      .input((input) => {
        if (typeof (input as { item?: unknown })?.item !== 'string')
          throw new Error('an order needs an item');
        return input as { item: string; idempotencyKey?: string };
      })
      .mutation(async ({ input, ctx }) => {
        hooks.entered?.();
        await hooks.hold;
        if (hooks.fail?.()) throw new TRPCError({ code: 'BAD_GATEWAY', message: 'the warehouse is down' });
        const order: Order = { id: orders.length + 1, item: input.item, key: ctx.idempotency?.key };
        orders.push(order);
        return order;
      }),
    // Not JSON: a Date would not come back from the store as itself.
    stamp: guarded.mutation(() => new Date()),
    count: guarded.query(() => orders.length),
  });
  const server = createHTTPServer({ router, createContext: ({ req }) => ({ req }) });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const headers = ({ op }: { op: { context: Record<string, unknown> } }) =>
    typeof op.context.key === 'string' ? { 'idempotency-key': op.context.key } : {};
  const client = createTRPCClient<typeof router>({ links: [httpLink({ url, headers })] });
  const batching = createTRPCClient<typeof router>({
    links: [httpBatchLink({ url, headers: () => ({ 'idempotency-key': 'batch-1' }) })],
  });
  // A client of `authorization`'s whose every mutation carries the key `k`.
  const as = (authorization: string) =>
    createTRPCClient<typeof router>({
      links: [httpLink({ url, headers: { authorization, 'idempotency-key': 'k' } })],
    });
  return { client, batching, orders, as };
}

/** The rejection `promise` ends in, as a tRPC client error. */
async function failure(promise: Promise<unknown>): Promise<TRPCClientError<any>> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(TRPCClientError);
  return error as TRPCClientError<any>;
}

describe('retrysafe/trpc with tRPC’s HTTP server and client', () => {
  it('runs a mutation once per key and answers the retry with the same output', async () => {
    const { client, orders } = await startApp();
    const first = await client.createOrder.mutate({ item: 'book' }, { context: { key: 'order-1' } });
    expect(first).toEqual({ id: 1, item: 'book', key: 'order-1' });
    expect(await client.createOrder.mutate({ item: 'book' }, { context: { key: 'order-1' } })).toEqual(first);
    expect(orders).toHaveLength(1);
    // Without a key the mutation runs as it would without the middleware.
    expect(await client.createOrder.mutate({ item: 'book' })).toEqual({ id: 2, item: 'book' });
    expect(await client.count.query()).toBe(2);
  });

  it("keeps each caller's keys apart: by Authorization, or by the `scope` given", async () => {
    const { as, orders } = await startApp();
    const ada = await as('Bearer ada').createOrder.mutate({ item: 'book' });
    const bob = await as('Bearer bob').createOrder.mutate({ item: 'book' });
    expect([ada.id, bob.id]).toEqual([1, 2]);
    expect(await as('Bearer ada').createOrder.mutate({ item: 'book' })).toEqual(ada);
    expect(orders).toHaveLength(2);
    const shared = await startApp({ scope: () => 'one-account' });
    const first = await shared.as('Bearer ada').createOrder.mutate({ item: 'book' });
    expect(await shared.as('Bearer bob').createOrder.mutate({ item: 'book' })).toEqual(first);
    expect(shared.orders).toHaveLength(1);
  });

  it('answers another input under a used key with CONFLICT (HTTP 409), running nothing', async () => {
    const { client, orders } = await startApp();
    await client.createOrder.mutate({ item: 'book' }, { context: { key: 'order-1' } });
    const error = await failure(client.createOrder.mutate({ item: 'pen' }, { context: { key: 'order-1' } }));
    expect(error.data).toMatchObject({ code: 'CONFLICT', httpStatus: 409 });
    expect(error.message).toMatch(/already used with another mutation or input/);
    expect(orders).toHaveLength(1);
  });

  it('answers a call while the first is still running with TOO_MANY_REQUESTS (429), then replays', async () => {
    const hold = deferred();
    const entered = deferred();
    const { client, orders } = await startApp(
      { concurrency: 'reject' },
      { hold: hold.promise, entered: entered.resolve },
    );
    const first = client.createOrder.mutate({ item: 'book' }, { context: { key: 'order-1' } });
    await entered.promise;
    const error = await failure(client.createOrder.mutate({ item: 'book' }, { context: { key: 'order-1' } }));
    expect(error.data).toMatchObject({ code: 'TOO_MANY_REQUESTS', httpStatus: 429 });
    hold.resolve();
    const order = await first;
    expect(await client.createOrder.mutate({ item: 'book' }, { context: { key: 'order-1' } })).toEqual(order);
    expect(orders).toHaveLength(1);
  });

  it('frees the key when the resolver throws: the retry runs', async () => {
    let failing = true;
    const { client, orders } = await startApp({}, { fail: () => failing });
    const error = await failure(client.createOrder.mutate({ item: 'book' }, { context: { key: 'order-1' } }));
    expect(error.data).toMatchObject({ code: 'BAD_GATEWAY' });
    failing = false;
    expect(await client.createOrder.mutate({ item: 'book' }, { context: { key: 'order-1' } })).toMatchObject({
      id: 1,
    });
    expect(orders).toHaveLength(1);
  });

  it('refuses a malformed key, and no key when required, with BAD_REQUEST before the resolver', async () => {
    const { client, orders } = await startApp({ required: true });
    const malformed = await failure(client.createOrder.mutate({ item: 'book' }, { context: { key: 'a b' } }));
    expect(malformed.data).toMatchObject({ code: 'BAD_REQUEST', httpStatus: 400 });
    const missing = await failure(client.createOrder.mutate({ item: 'book' }));
    expect(missing.data).toMatchObject({ code: 'BAD_REQUEST' });
    expect(missing.message).toMatch(/requires an Idempotency-Key/);
    expect(orders).toHaveLength(0);
  });

  it('refuses a result that is not JSON and frees the key', async () => {
    const { client } = await startApp();
    const error = await failure(client.stamp.mutate(undefined, { context: { key: 'stamp-1' } }));
    expect(error.data).toMatchObject({ code: 'INTERNAL_SERVER_ERROR' });
    expect(error.message).toMatch(/cannot be saved.*Date/);
  });

  it('takes the key from an input field when told to, a key per call even in a batch', async () => {
    const { batching, orders } = await startApp({ inputField: 'idempotencyKey' });
    const [a, b] = await Promise.all([
      batching.createOrder.mutate({ item: 'book', idempotencyKey: 'in-1' }),
      batching.createOrder.mutate({ item: 'pen', idempotencyKey: 'in-2' }),
    ]);
    expect([a.key, b.key]).toEqual(['in-1', 'in-2']);
    expect(await batching.createOrder.mutate({ item: 'book', idempotencyKey: 'in-1' })).toEqual(a);
    expect(orders).toHaveLength(2);
  });

  it('in a batch of mutations under one header key, runs the first and refuses the others', async () => {
    const { batching, orders } = await startApp();
    const [first, second] = await Promise.allSettled([
      batching.createOrder.mutate({ item: 'book' }),
      batching.createOrder.mutate({ item: 'pen' }),
    ]);
    expect(first).toMatchObject({ status: 'fulfilled', value: { item: 'book', key: 'batch-1' } });
    expect(second.status).toBe('rejected');
    expect(((second as PromiseRejectedResult).reason as TRPCClientError<any>).data).toMatchObject({
      code: 'BAD_REQUEST',
    });
    expect(orders).toHaveLength(1);
  });

  it("reads the key from a Web Request's headers, as tRPC's fetch adapter hands ctx.req", async () => {
    const t = initTRPC.context<{ req: Request }>().create();
    let runs = 0;
    const router = t.router({
      createOrder: t.procedure
        .use(idempotency({ store: memoryStore() }))
        .mutation(({ ctx }) => ({ run: ++runs, key: ctx.idempotency?.key })),
    });
    const call = async (key: string) => {
      const req = new Request('http://app.test/trpc/createOrder', {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
      });
      const response = await fetchRequestHandler({
        endpoint: '/trpc',
        req,
        router,
        createContext: ({ req }) => ({ req }),
      });
      return response.json();
    };
    const first = await call('fetch-1');
    expect(first).toEqual({ result: { data: { run: 1, key: 'fetch-1' } } });
    expect(await call('fetch-1')).toEqual(first);
    expect(runs).toBe(1);
  });

  it('fails at construction on a misspelt or mistyped option', () => {
    expect(() => idempotency({ store: memoryStore(), inputFeild: 'k' } as never)).toThrow(
      /has no option `inputFeild`\. Did you mean `inputField`\?/,
    );
    expect(() => idempotency({ store: memoryStore(), inputField: '' })).toThrow(ConfigError);
    expect(() => idempotency({ store: memoryStore(), required: 'yes' as never })).toThrow(ConfigError);
  });

  it('types ctx.idempotency for the resolver', () => {
    const t = initTRPC.create();
    t.procedure.use(idempotency({ store: memoryStore() })).mutation(({ ctx }) => {
      const ctxType: IdempotencyCtx['idempotency'] = ctx.idempotency;
      return ctxType?.key ?? null;
    });
  });
});

describe('examples/trpc/app.js', () => {
  it('serves POST /trpc/createOrder: one order per key, the same output, 409 for another input', async () => {
    await serveOneReplay({
      command: process.execPath,
      args: [join(root, 'examples/trpc/app.js')],
      cwd: mkdtempSync(join(tmpdir(), 'retrysafe-trpc-')),
      env: { NODE_ENV: 'production' },
      check: checkTrpcExample,
    });
  });
});
