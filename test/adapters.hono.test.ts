import { gunzipSync } from 'node:zlib';
import { type Context, Hono } from 'hono';
import { compress } from 'hono/compress';
import { HTTPException } from 'hono/http-exception';
import { streamText } from 'hono/streaming';
import { afterAll, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/hono.js';
import { isIdempotencyError } from '../src/core/contract/index.js';
import { memoryStore } from '../src/stores/memory.js';
import { describeAdapterConformance } from '../src/testing/adapter-suite.js';
import { type Env, honoAdapter } from './conformance/apps/hono.js';
import { catalogPage, RETRIES_WITHOUT_GZIP } from './support/compression.js';
import { memory, sqlite } from './support/store-factories.js';

describeAdapterConformance(honoAdapter, [memory, sqlite]);

describe('hono specifics', () => {
  const store = memoryStore();
  afterAll(() => store.close());
  let count = 0;
  const app = new Hono<Env>();
  app.use('/required', idempotency({ store, required: true }));
  app.use('/optional', idempotency({ store }));
  app.use('/custom-errors', idempotency({ store, required: true }));
  app.use('/validation', idempotency({ store }));
  const echo = async (c: Context<Env>) => {
    count++;
    return c.json({ n: count, key: c.get('idempotency')?.key ?? null, body: await c.req.json() }, 201);
  };
  app.post('/required', echo);
  app.post('/optional', echo);
  app.post('/custom-errors', echo);
  app.use('/streamed', idempotency({ store }));
  app.post('/streamed', (c) =>
    streamText(c, async (stream) => {
      count++;
      for (const word of ['one ', 'two ', `${count}`]) {
        await stream.write(word);
        await stream.sleep(5);
      }
    }),
  );
  // compress() after the middleware: what the middleware captures is already gzip.
  app.use('/compressed', idempotency({ store }), compress());
  app.post('/compressed', (c) => c.json(catalogPage, 201));
  app.post('/validation', () => {
    throw new HTTPException(422, { message: 'bad isbn' });
  });
  app.onError((error, c) => {
    if (
      c.req.path === '/custom-errors' &&
      error instanceof HTTPException &&
      isIdempotencyError(error.cause)
    ) {
      return c.json({ custom: error.cause.code }, error.status);
    }
    return error instanceof HTTPException ? error.getResponse() : c.json({ error: 'internal' }, 500);
  });

  const call = (path: string, key?: string, body = '{"a":1}') =>
    app.request(path, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        ...(key === undefined ? {} : { 'idempotency-key': key }),
      },
      body,
    });

  it('per-path options, and the whole flow on app.request() (Web-standard, no server)', async () => {
    const missing = await call('/required');
    expect(missing.status).toBe(400);
    expect(await missing.json()).toMatchObject({ error: 'idempotency_key_missing' });
    expect((await call('/optional')).status).toBe(201);
    const first = await call('/required', 'web-1');
    const replay = await call('/required', 'web-1');
    expect(replay.headers.get('idempotency-replayed')).toBe('true');
    expect(await replay.text()).toBe(await first.text());
  });

  it('the handler still reads the body with c.req.json() after the middleware read it', async () => {
    const reply = await call('/optional', 'body-1', '{"b":[1,2]}');
    expect(await reply.json()).toMatchObject({ key: 'body-1', body: { b: [1, 2] } });
  });

  it('a control character in the key is refused by the engine (no node:http parser in front here)', async () => {
    const reply = await call('/optional', 'a\x01b');
    expect(reply.status).toBe(400);
    expect(await reply.json()).toMatchObject({ error: 'idempotency_key_invalid' });
  });

  it('engine errors reach a custom app.onError as HTTPException with the IdempotencyError as cause', async () => {
    const reply = await call('/custom-errors');
    expect(reply.status).toBe(400);
    expect(await reply.json()).toEqual({ custom: 'idempotency_key_missing' });
  });

  it("a body written later by hono/streaming's streamText is captured and replayed", async () => {
    const first = await call('/streamed', 'stream-1');
    const text = await first.text();
    expect(text).toMatch(/^one two \d+$/);
    const replay = await call('/streamed', 'stream-1');
    expect(replay.headers.get('idempotency-replayed')).toBe('true');
    expect(await replay.text()).toBe(text);
  });

  it('compress() after the middleware: the replay keeps content-encoding and decodes to the same JSON', async () => {
    const gzip = async () => {
      const res = await app.request('/compressed', {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'accept-encoding': 'gzip',
          'idempotency-key': 'gzip-1',
        },
        body: '{}',
      });
      return { res, bytes: Buffer.from(await res.arrayBuffer()) };
    };
    const first = await gzip();
    expect(first.res.status).toBe(201);
    expect(first.res.headers.get('content-encoding')).toBe('gzip');
    const replay = await gzip();
    expect(replay.res.headers.get('idempotency-replayed')).toBe('true');
    expect(replay.res.headers.get('content-encoding')).toBe('gzip');
    expect(replay.res.headers.get('vary')).toBe(first.res.headers.get('vary'));
    expect(JSON.parse(gunzipSync(replay.bytes).toString())).toEqual(catalogPage);
    expect(JSON.parse(gunzipSync(first.bytes).toString())).toEqual(catalogPage);
  });

  it.each(RETRIES_WITHOUT_GZIP)(
    'compress() after the middleware: a retry accepting %s gets the replay decoded',
    async (name, accept) => {
      const post = (acceptEncoding: string | undefined) =>
        app.request('/compressed', {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            'idempotency-key': `gzip-${name.replaceAll(' ', '-')}`,
            ...(acceptEncoding === undefined ? {} : { 'accept-encoding': acceptEncoding }),
          },
          body: '{}',
        });
      const first = await post('gzip');
      expect(first.headers.get('content-encoding')).toBe('gzip');
      const replay = await post(accept);
      expect(replay.status).toBe(201);
      expect(replay.headers.get('idempotency-replayed')).toBe('true');
      expect(replay.headers.get('content-encoding')).toBeNull();
      expect(replay.headers.get('vary')).toBe(first.headers.get('vary'));
      const bytes = Buffer.from(await replay.arrayBuffer());
      expect(JSON.parse(bytes.toString())).toEqual(catalogPage);
    },
  );

  it('an HTTPException the handler throws releases the key, whatever its status', async () => {
    expect((await call('/validation', 'v-1')).status).toBe(422);
    const again = await call('/validation', 'v-1');
    expect(again.status).toBe(422);
    expect(again.headers.get('idempotency-replayed')).toBeNull();
  });
});
