import { mkdtempSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApolloServer } from '@apollo/server';
import { startStandaloneServer } from '@apollo/server/standalone';
import type { GraphQLResolveInfo } from 'graphql';
import { createSchema, createYoga } from 'graphql-yoga';
import { afterAll, describe, expect, it } from 'vitest';
import {
  apolloIdempotency,
  type GraphqlIdempotencyOptions,
  idempotencyOf,
  idempotentDirective,
  useIdempotency,
} from '../src/adapters/graphql.js';
import { memoryStore } from '../src/stores/memory.js';
import { checkGraphqlExample } from './support/mutation-examples.js';
import { serveOneReplay } from './support/quick-start.js';

const root = join(import.meta.dirname, '..');

interface Order {
  id: number;
  item: string;
  key: string | null;
}

interface Hooks {
  hold?: Promise<void>;
  entered?: () => void;
  fail?: () => boolean;
}

const typeDefs = /* GraphQL */ `
  ${idempotentDirective}
  type Order { id: Int! item: String! key: String }
  type Query { orders: [Order!]! }
  type Mutation { createOrder(item: String!): Order! note(text: String!): Int! }
`;

/** The resolvers every server under test shares: orders made, and an unguarded `note`. */
function resolversOf(orders: Order[], hooks: Hooks) {
  let notes = 0;
  return {
    Query: { orders: () => orders },
    Mutation: {
      createOrder: async (
        _: unknown,
        { item }: { item: string },
        _ctx: unknown,
        info: GraphQLResolveInfo,
      ) => {
        hooks.entered?.();
        await hooks.hold;
        if (hooks.fail?.()) throw new Error('the warehouse is down');
        const order = { id: orders.length + 1, item, key: idempotencyOf(info)?.key ?? null };
        orders.push(order);
        return order;
      },
      note: () => ++notes,
    },
  };
}

type Start = (options: GraphqlIdempotencyOptions, hooks: Hooks) => Promise<{ url: string; orders: Order[] }>;

const closers: Array<() => unknown> = [];
afterAll(async () => {
  for (const close of closers) await close();
});

const startYoga: Start = async (options, hooks) => {
  const orders: Order[] = [];
  const yoga = createYoga({
    schema: createSchema({ typeDefs, resolvers: resolversOf(orders, hooks) }),
    plugins: [useIdempotency(options)],
    logging: false,
  });
  const server = createServer(yoga);
  closers.push(() => void server.close());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/graphql`, orders };
};

const startApollo: Start = async (options, hooks) => {
  const orders: Order[] = [];
  const server = new ApolloServer<{ user: string }>({
    typeDefs,
    resolvers: resolversOf(orders, hooks),
    plugins: [apolloIdempotency(options)],
  });
  // A context of the app's own, without the request: the plugin reads the header from Apollo.
  const { url } = await startStandaloneServer(server, {
    listen: { port: 0, host: '127.0.0.1' },
    context: async () => ({ user: 'ada' }),
  });
  closers.push(() => server.stop());
  return { url, orders };
};

function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

interface Answer {
  data: Record<string, unknown> | null;
  errors?: Array<{ message: string; path?: string[]; extensions: { code: string } }>;
}

async function post(url: string, query: string, key?: string, variables?: object): Promise<Answer> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
    body: JSON.stringify({ query, variables }),
  });
  expect(response.status).toBe(200);
  return (await response.json()) as Answer;
}

const codes = (answer: Answer) => answer.errors?.map((error) => error.extensions.code);
const order = (item: string) => `mutation { createOrder(item: "${item}") { id item key } }`;

describe.each([
  ['GraphQL Yoga (envelop)', startYoga],
  ['Apollo Server 5', startApollo],
] as const)('retrysafe/graphql on %s', (_name, start) => {
  const store = () => ({ store: memoryStore(), mutations: ['createOrder'] });

  it('runs a mutation once per header key, the same data for the retry, KEY_CONFLICT for another item', async () => {
    const { url, orders } = await start(store(), {});
    const first = await post(url, order('book'), 'order-1');
    expect(first).toEqual({ data: { createOrder: { id: 1, item: 'book', key: 'order-1' } } });
    expect(await post(url, order('book'), 'order-1')).toEqual(first);
    // Another selection of the same mutation replays the same result.
    expect(await post(url, 'mutation { createOrder(item: "book") { id } }', 'order-1')).toEqual({
      data: { createOrder: { id: 1 } },
    });
    const conflict = await post(url, order('pen'), 'order-1');
    expect(conflict.data).toBeNull();
    expect(codes(conflict)).toEqual(['KEY_CONFLICT']);
    expect(orders).toHaveLength(1);
    // Without a key, a guarded mutation runs as it would without the plugin.
    await post(url, order('book'));
    expect(orders).toHaveLength(2);
  });

  it('takes the key from @idempotent(key:), variables resolved, before the header', async () => {
    const { url, orders } = await start(store(), {});
    const query = 'mutation ($k: String!) { createOrder(item: "book") @idempotent(key: $k) { id key } }';
    const first = await post(url, query, 'header-key', { k: 'directive-1' });
    expect(first).toEqual({ data: { createOrder: { id: 1, key: 'directive-1' } } });
    expect(await post(url, query, undefined, { k: 'directive-1' })).toEqual(first);
    const bad = await post(url, query, undefined, { k: '' });
    expect(codes(bad)).toEqual(['IDEMPOTENCY_KEY_INVALID']);
    expect(orders).toHaveLength(1);
  });

  it('refuses two guarded mutations under one header key, running neither; keys of their own run each once', async () => {
    const { url, orders } = await start(store(), {});
    const two = 'mutation { a: createOrder(item: "book") { id } b: createOrder(item: "pen") { id } }';
    const refused = await post(url, two, 'order-1');
    // The first refusal of a non-null field nulls `data`, and graphql-js stops the serial run there.
    expect(codes(refused)).toEqual(['IDEMPOTENCY_KEY_AMBIGUOUS']);
    expect(orders).toHaveLength(0);
    const keyed =
      'mutation { a: createOrder(item: "book") @idempotent(key: "a-1") { id } b: createOrder(item: "pen") @idempotent(key: "b-1") { id } }';
    const first = await post(url, keyed, 'order-1');
    expect(first).toEqual({ data: { a: { id: 1 }, b: { id: 2 } } });
    expect(await post(url, keyed)).toEqual(first);
    expect(orders).toHaveLength(2);
    // An unguarded mutation beside one guarded one leaves the header to that one.
    const mixed = 'mutation { createOrder(item: "cup") { id } note(text: "hi") }';
    expect(await post(url, mixed, 'order-2')).toEqual({ data: { createOrder: { id: 3 }, note: 1 } });
    expect(await post(url, mixed, 'order-2')).toEqual({ data: { createOrder: { id: 3 }, note: 2 } });
  });

  it('answers a request while the first is still running with REQUEST_IN_PROGRESS, then replays', async () => {
    const hold = deferred();
    const entered = deferred();
    const { url, orders } = await start(
      { ...store(), concurrency: 'reject' },
      { hold: hold.promise, entered: entered.resolve },
    );
    const first = post(url, order('book'), 'order-1');
    await entered.promise;
    expect(codes(await post(url, order('book'), 'order-1'))).toEqual(['REQUEST_IN_PROGRESS']);
    hold.resolve();
    const answer = await first;
    expect(await post(url, order('book'), 'order-1')).toEqual(answer);
    expect(orders).toHaveLength(1);
  });

  it("frees the key when the resolver throws: the retry runs; the resolver's error is its own", async () => {
    let failing = true;
    const { url, orders } = await start(store(), { fail: () => failing });
    const failed = await post(url, order('book'), 'order-1');
    expect(failed.data).toBeNull();
    expect(codes(failed)).not.toContain('KEY_CONFLICT');
    failing = false;
    expect(await post(url, order('book'), 'order-1')).toMatchObject({ data: { createOrder: { id: 1 } } });
    expect(orders).toHaveLength(1);
  });

  it('with required: true refuses a guarded mutation without a key, IDEMPOTENCY_KEY_MISSING', async () => {
    const { url, orders } = await start({ ...store(), required: true }, {});
    expect(codes(await post(url, order('book')))).toEqual(['IDEMPOTENCY_KEY_MISSING']);
    expect(codes(await post(url, order('book'), 'a b'))).toEqual(['IDEMPOTENCY_KEY_INVALID']);
    expect(orders).toHaveLength(0);
  });

  it('names a mutation the schema lacks when the server starts', async () => {
    await expect(start({ store: memoryStore(), mutations: ['createOrdr'] }, {})).rejects.toThrow(
      /names no field of the Mutation type: createOrdr/,
    );
  });
});

describe('examples/graphql/app.js', () => {
  it('serves POST /graphql on Yoga: one order per key, the same data, KEY_CONFLICT for another item', async () => {
    await serveOneReplay({
      command: process.execPath,
      args: [join(root, 'examples/graphql/app.js')],
      cwd: mkdtempSync(join(tmpdir(), 'retrysafe-graphql-')),
      check: checkGraphqlExample,
    });
  });
});
