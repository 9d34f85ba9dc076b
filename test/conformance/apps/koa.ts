import http from 'node:http';
import { createRequire } from 'node:module';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { bodyParser } from '@koa/bodyparser';
import type Koa3 from 'koa';
import type { Context } from 'koa';
import { idempotency } from '../../../src/adapters/koa.js';
import {
  type AdapterUnderTest,
  CATALOG_POST_PATHS,
  listen,
  paced,
  plan,
} from '../../../src/testing/adapter-suite.js';

// The adapter suite's catalog served by Koa (2 and 3, with @koa/bodyparser in front or no parser): its conformance tests and the adapter fuzz
// (test/fuzz) run against this app.

// Koa 2 is installed under an alias (npm:koa@2); its API is the one typed for Koa 3 here.
export const Koa2 = createRequire(import.meta.url)('koa2') as typeof Koa3;

type Koa = typeof Koa3;

const THROW_PATHS = ['/throw', '/throw-async', '/ctx-throw'];
const ROUTES = new Set(['/orders', ...CATALOG_POST_PATHS, '/parser-after', ...THROW_PATHS]);

/**
 * `parser`: mount `@koa/bodyparser` before the middleware (fingerprint from its rawBody) or
 * nothing (the middleware reads the body into `ctx.request.body`, and `/parser-after` mounts
 * `@koa/bodyparser` after it).
 */
export function koaAdapter(name: string, Koa: Koa, parser: boolean): AdapterUnderTest {
  return {
    name,
    throwPaths: THROW_PATHS,
    bodyParsers: parser ? 'before' : 'after',
    async start({ scopeByAuthorization, ...options }) {
      const calls: Record<string, number> = {};
      const app = new Koa();
      // Thrown handler errors are expected here; Koa would log each one.
      app.silent = true;
      // Past the suite's largest upload, as express.json() in the Express tests: maxBodyBytes answers.
      if (parser) app.use(bodyParser({ jsonLimit: '10mb' }));
      const idem = idempotency({
        ...options,
        ...(scopeByAuthorization ? { scope: (ctx) => ctx.get('authorization') } : {}),
      });
      app.use(idem);
      if (!parser) {
        const later = bodyParser();
        app.use((ctx, next) => (ctx.path === '/parser-after' ? later(ctx, next) : next()));
      }
      app.use(async (ctx: Context) => {
        if (!ROUTES.has(ctx.path)) return;
        const url = new URL(ctx.originalUrl, 'http://x');
        const planned = plan(calls, ctx.method, url, ctx.state.idempotency, ctx.request.body);
        if (planned.delayMs) await sleep(planned.delayMs);
        if (planned.kind === 'fail') {
          if (ctx.path === '/throw') throw new Error('boom');
          if (ctx.path === '/ctx-throw') ctx.throw(503, 'unavailable');
          await sleep(1);
          throw new Error('boom');
        }
        ctx.status = planned.status;
        ctx.set(planned.headers);
        switch (planned.kind) {
          case 'json':
            ctx.body = planned.json;
            break;
          case 'text':
            ctx.body = planned.text;
            break;
          case 'bytes':
            ctx.body = planned.bytes;
            break;
          case 'empty':
            break;
          case 'stream':
            ctx.body = Readable.from(paced(planned.chunks));
            break;
        }
      });
      return listen(http.createServer(app.callback()), calls, idem.resumeThrough(app));
    },
  };
}
