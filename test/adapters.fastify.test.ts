import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/fastify.js';
import { ConfigError, type IdempotencyError } from '../src/core/contract/index.js';
import { memoryStore } from '../src/stores/memory.js';
import { describeAdapterConformance } from '../src/testing/adapter-suite.js';
import { fastifyAdapter } from './conformance/apps/fastify.js';
import { memory, redis, sqlite } from './support/store-factories.js';

describeAdapterConformance(fastifyAdapter, [memory, sqlite, redis]);

describe('fastify specifics', () => {
  const store = memoryStore();
  let app: FastifyInstance;
  let url: string;
  const seen: string[] = [];

  beforeAll(async () => {
    app = Fastify({ bodyLimit: 2048 });
    await app.register(idempotency, { store, maxBodyBytes: 1_000_000 });
    const echo = async (request: FastifyRequest, reply: FastifyReply) => {
      seen.push(`${request.url} ${request.idempotency?.key ?? '-'}`);
      return reply.code(201).send({ key: request.idempotency?.key ?? null, body: request.body ?? null });
    };
    app.post('/default', echo);
    app.post('/required', { config: { idempotency: { required: true, ttl: '1h' } } }, echo);
    app.post('/unguarded', { config: { idempotency: false } }, echo);
    app.post('/put-guarded', { config: { idempotency: { methods: ['PUT'] } } }, echo);
    app.put('/put-guarded', { config: { idempotency: { methods: ['PUT'] } } }, echo);
    await app.register(async (child) => {
      child.setErrorHandler((error: IdempotencyError, _request, reply) => {
        reply.code(error.statusCode).headers(error.headers).send({ custom: error.code });
      });
      child.post('/child', { config: { idempotency: { renderErrors: false, required: true } } }, echo);
    });
    app.post('/fastify-errors', { config: { idempotency: { renderErrors: false } } }, echo);
    await app.listen({ port: 0, host: '127.0.0.1' });
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    await app.close();
    await store.close();
  });

  async function call(method: string, path: string, key?: string, body = '{"a":1}') {
    const res = await fetch(url + path, {
      method,
      headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
      body,
    });
    return { status: res.status, headers: res.headers, json: await res.json() };
  }

  it('bad options fail at registration, naming the option', async () => {
    await expect(Fastify().register(idempotency, { store, wait: -1 }).ready()).rejects.toThrow(/`wait`/);
    const bad = Fastify();
    await bad.register(idempotency, { store });
    // A route's own options are checked as the route is declared.
    expect(() =>
      bad.post(
        '/x',
        { config: { idempotency: { renderErrors: 'no' as unknown as boolean } } },
        async () => 'x',
      ),
    ).toThrow(ConfigError);
  });

  it('route config merges over the plugin defaults', async () => {
    expect((await call('POST', '/default')).status).toBe(201);
    const missing = await call('POST', '/required');
    expect(missing.status).toBe(400);
    expect(missing.json).toMatchObject({ error: 'idempotency_key_missing' });
    const put1 = await call('PUT', '/put-guarded', 'put-1');
    const put2 = await call('PUT', '/put-guarded', 'put-1');
    expect(put2.headers.get('idempotency-replayed')).toBe('true');
    expect(put2.json).toEqual(put1.json);
    const post = await call('POST', '/put-guarded', 'put-1');
    expect(post.headers.get('idempotency-replayed')).toBeNull();
    expect(post.json.key).toBeNull();
  });

  it('config: { idempotency: false } leaves a route unguarded', async () => {
    const first = await call('POST', '/unguarded', 'u-1');
    const second = await call('POST', '/unguarded', 'u-1');
    expect(second.headers.get('idempotency-replayed')).toBeNull();
    expect([first.json.key, second.json.key]).toEqual([null, null]);
    expect(seen.filter((s) => s.startsWith('/unguarded'))).toHaveLength(2);
  });

  it('the handler gets the parsed body and request.idempotency', async () => {
    const reply = await call('POST', '/default', 'ctx-1', '{"b":[1,2]}');
    expect(reply.json).toEqual({ key: 'ctx-1', body: { b: [1, 2] } });
  });

  it('renderErrors: false throws into setErrorHandler (and the default handler keeps status and headers)', async () => {
    const custom = await call('POST', '/child');
    expect(custom.status).toBe(400);
    expect(custom.json).toEqual({ custom: 'idempotency_key_missing' });
    await call('POST', '/fastify-errors', 'fe-1', '{"a":1}');
    const conflict = await call('POST', '/fastify-errors', 'fe-1', '{"a":2}');
    expect(conflict.status).toBe(409);
    expect(conflict.json).toMatchObject({ statusCode: 409, code: 'key_conflict' });
  });

  it("Fastify's bodyLimit answers before maxBodyBytes", async () => {
    const reply = await call('POST', '/default', 'big-1', JSON.stringify({ pad: 'x'.repeat(5000) }));
    expect(reply.status).toBe(413);
    expect(reply.json).toMatchObject({ code: 'FST_ERR_CTP_BODY_TOO_LARGE' });
    expect(seen.some((s) => s.includes('big-1'))).toBe(false);
  });
});

describe('registration styles', () => {
  // The common Fastify style declares routes right after `register`, without awaiting it: the
  // plugin has not loaded yet when those routes are declared.
  for (const style of ['awaited', 'not awaited', 'routes declared first'] as const) {
    it(`guards routes when register is ${style}`, async () => {
      const app = Fastify();
      let runs = 0;
      const route = () =>
        app.post('/orders', async (_request, reply) => reply.code(201).send({ run: ++runs }));
      if (style === 'routes declared first') route();
      const registered = app.register(idempotency, { store: memoryStore(), required: true });
      if (style === 'awaited') await registered;
      if (style !== 'routes declared first') route();
      app.post('/own', { config: { idempotency: { required: false } } }, async () => ({ run: ++runs }));
      await app.ready();
      const post = (url: string, key?: string) =>
        app.inject({ method: 'POST', url, payload: {}, headers: key ? { 'idempotency-key': key } : {} });

      expect((await post('/orders')).statusCode).toBe(400);
      const first = await post('/orders', 'k-1');
      const second = await post('/orders', 'k-1');
      expect(second.headers['idempotency-replayed']).toBe('true');
      expect(second.body).toBe(first.body);
      expect((await post('/own')).statusCode).toBe(200);
      expect(runs).toBe(2);
      await app.close();
    });
  }

  it('is a named fastify-plugin with a Fastify version range', async () => {
    const meta = (idempotency as unknown as Record<symbol, { name?: string; fastify?: string }>)[
      Symbol.for('plugin-meta')
    ];
    expect(meta).toMatchObject({ name: 'retrysafe', fastify: '5.x' });
  });
});

describe('hook order', () => {
  // An auth check must run before the key is claimed: a refused request then stores nothing, and
  // the authorised retry with the same key runs. Routes declared after the plugin loaded get their
  // guard after their own preHandler; routes declared before it (register not awaited) are guarded
  // from instance hooks, which run before any route hook but after preValidation.
  for (const [style, hook] of [
    ['awaited', 'preHandler'],
    ['not awaited', 'preValidation'],
  ] as const) {
    it(`a route's own ${hook} runs before the claim (register ${style})`, async () => {
      const app = Fastify();
      const registered = app.register(idempotency, { store: memoryStore(), scope: () => 'tenant' });
      if (style === 'awaited') await registered;
      let runs = 0;
      app.post(
        '/orders',
        {
          [hook]: async (request: FastifyRequest, reply: FastifyReply) => {
            if (request.headers.authorization !== 'Bearer ok') return reply.code(401).send({ error: 'auth' });
          },
        },
        async (_request, reply) => reply.code(201).send({ run: ++runs }),
      );
      await app.ready();
      const post = (authorization: string) =>
        app.inject({
          method: 'POST',
          url: '/orders',
          payload: {},
          headers: { 'idempotency-key': 'k-auth', authorization },
        });
      expect((await post('Bearer no')).statusCode).toBe(401);
      const authorised = await post('Bearer ok');
      expect(authorised.statusCode).toBe(201);
      expect(authorised.headers['idempotency-replayed']).toBeUndefined();
      await app.close();
    });
  }
});
