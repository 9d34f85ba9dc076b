import http from 'node:http';
import Koa3, { type Context, type Middleware } from 'koa';
import { beforeAll, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/koa.js';
import type { IdempotencyError } from '../src/core/contract/index.js';
import { memoryStore } from '../src/stores/memory.js';
import { describeAdapterConformance, listen, type RunningApp } from '../src/testing/adapter-suite.js';
import { Koa2, koaAdapter } from './conformance/apps/koa.js';
import { badKeyOnLargeUpload, describeAdapterSpecifics, postJson } from './support/adapter-specifics.js';
import { memory, postgres, redis, sqlite } from './support/store-factories.js';

describeAdapterConformance(koaAdapter('koa 3 (@koa/bodyparser first)', Koa3, true), [
  memory,
  sqlite,
  postgres,
  redis,
]);
describeAdapterConformance(koaAdapter('koa 2 (no body parser)', Koa2, false), [
  memory,
  sqlite,
  postgres,
  redis,
]);
describeAdapterConformance(koaAdapter('koa 2 (@koa/bodyparser first)', Koa2, true), [memory]);
describeAdapterConformance(koaAdapter('koa 3 (no body parser)', Koa3, false), [memory]);

describeAdapterSpecifics('koa specifics', idempotency, (store, started) => {
  for (const [version, Koa] of [
    ['3', Koa3],
    ['2', Koa2],
  ] as const) {
    describe(`koa ${version}`, () => {
      let app: RunningApp;
      let runs = 0;
      beforeAll(async () => {
        const koa = new Koa();
        koa.silent = true;
        const routes: Record<string, Middleware[]> = {
          // The app's own error middleware, upstream: it renders what downstream throws.
          '/caught': [
            async (ctx, next) => {
              try {
                await next();
              } catch (error) {
                ctx.status = (error as { status?: number }).status ?? 500;
                ctx.body = { error: 'app_error' };
              }
            },
            idempotency({ store }),
            (ctx) => ctx.throw(422, 'bad isbn'),
          ],
          '/ctx-throw-4xx': [idempotency({ store }), (ctx) => ctx.throw(409, 'on loan')],
          '/thrown-errors': [
            async (ctx, next) => {
              try {
                await next();
              } catch (error) {
                const idem = error as IdempotencyError;
                ctx.status = idem.status;
                ctx.set(idem.headers);
                ctx.body = { custom: idem.code };
              }
            },
            idempotency({ store, required: true, renderErrors: false }),
            echo,
          ],
          '/default-errors': [idempotency({ store, required: true, renderErrors: false }), echo],
        };
        if (version === '3') {
          const web = (make: (text: string) => unknown): Middleware[] => [
            idempotency({ store }),
            (ctx) => {
              runs++;
              ctx.status = 201;
              ctx.type = 'text/plain';
              ctx.body = make(`web ${runs}`);
            },
          ];
          routes['/readable-stream'] = web((text) => new Blob([text]).stream());
          routes['/blob'] = web((text) => new Blob([text], { type: 'text/plain' }));
          routes['/response'] = web((text) => new Response(text, { status: 201 }));
        }
        koa.use(async (ctx, next) => {
          const chain = routes[ctx.path];
          if (!chain) return next();
          let i = 0;
          const step = (): Promise<void> => Promise.resolve(chain[i++]?.(ctx, step));
          await step();
        });
        app = started(await listen(http.createServer(koa.callback()), {}));
      });

      function echo(ctx: Context) {
        runs++;
        const body: unknown = ctx.request.body;
        ctx.status = 201;
        ctx.body = {
          body: Buffer.isBuffer(body) ? `buffer:${body.toString()}` : body,
          key: ctx.state.idempotency?.key ?? null,
          runs,
        };
      }

      it.each([
        ['an error downstream caught by an upstream middleware', '/caught', 422, '{"error":"app_error"}'],
        ['ctx.throw with a 4xx, which goes to Koa as usual,', '/ctx-throw-4xx', 409, 'on loan'],
      ])(
        '%s: the answer is not stored, the key released and the retry run again',
        async (_, path, status, text) => {
          const key = `${path}-${version}`;
          const first = await postJson(app, path, key);
          expect([first.status, first.text]).toEqual([status, text]);
          const retry = await postJson(app, path, key);
          expect(retry.status).toBe(status);
          expect(retry.headers.get('idempotency-replayed')).toBeNull();
        },
      );

      it('renderErrors: false throws the IdempotencyError upstream (and Koa answers it by its status)', async () => {
        const custom = await postJson(app, '/thrown-errors');
        expect(custom.status).toBe(400);
        expect(JSON.parse(custom.text)).toEqual({ custom: 'idempotency_key_missing' });
        const plain = await postJson(app, '/default-errors');
        expect([plain.status, plain.text]).toEqual([400, 'Bad Request']);
      });

      if (version === '3')
        it.each(['/readable-stream', '/blob', '/response'])(
          'a Koa 3 web body (%s) is captured and replayed',
          async (path) => {
            const key = `web-${path}`;
            const first = await postJson(app, path, key);
            expect([first.status, first.text]).toEqual([201, `web ${runs}`]);
            const replay = await postJson(app, path, key);
            expect(replay.headers.get('idempotency-replayed')).toBe('true');
            expect(replay.text).toBe(first.text);
            expect(replay.headers.get('content-type')).toBe(first.headers.get('content-type'));
          },
        );
    });
  }
});

it('koa, no body parser: the key header twice on a 900 KiB upload still being sent gets its 400, never a reset', async () => {
  const app = await koaAdapter('koa 2 (no body parser)', Koa2, false).start({ store: memoryStore() });
  try {
    expect(await badKeyOnLargeUpload(app)).toEqual([400, 400, 400]);
  } finally {
    await app.close();
  }
});
