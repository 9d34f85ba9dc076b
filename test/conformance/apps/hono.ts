import type { Server } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { createAdaptorServer } from '@hono/node-server';
import { type Context, Hono } from 'hono';
import { HTTPException } from 'hono/http-exception';
import type { ContentfulStatusCode } from 'hono/utils/http-status';
import { type IdempotencyVariables, idempotency } from '../../../src/adapters/hono.js';
import {
  type AdapterUnderTest,
  CATALOG_POST_PATHS,
  listen,
  pacedStream,
  plan,
  type RunningApp,
} from '../../../src/testing/adapter-suite.js';

// The adapter suite's catalog served by Hono on @hono/node-server: its conformance tests and the adapter fuzz
// (test/fuzz) run against this app.

export type Env = { Variables: IdempotencyVariables };

function serveHono(
  app: Hono<Env>,
  calls: Record<string, number>,
  resume?: RunningApp['resume'],
): Promise<RunningApp> {
  return listen(createAdaptorServer({ fetch: app.fetch }) as Server, calls, resume);
}

export const honoAdapter: AdapterUnderTest = {
  name: 'hono (@hono/node-server)',
  throwPaths: ['/throw', '/throw-http-exception'],
  async start({ scopeByAuthorization, ...options }) {
    const calls: Record<string, number> = {};
    const app = new Hono<Env>();
    const idem = idempotency({
      ...options,
      ...(scopeByAuthorization ? { scope: (c: Context) => c.req.header('authorization') ?? '' } : {}),
    });
    app.use(idem);
    const handler = async (c: Context<Env>) => {
      const planned = plan(calls, c.req.method, new URL(c.req.url), c.get('idempotency'), await c.req.text());
      if (planned.delayMs) await sleep(planned.delayMs);
      const status = planned.status as ContentfulStatusCode;
      switch (planned.kind) {
        case 'fail':
          if (c.req.path === '/throw') throw new Error('boom');
          throw new HTTPException(503, { message: 'unavailable' });
        case 'json':
          return c.json(planned.json, status, planned.headers);
        case 'text':
          return c.body(planned.text, status, planned.headers);
        case 'bytes':
          return c.body(new Uint8Array(planned.bytes), status, planned.headers);
        case 'empty':
          return c.body(null, 204, planned.headers);
        case 'stream':
          return c.body(pacedStream(planned.chunks), status, planned.headers);
      }
    };
    app.on(['GET', 'POST', 'PATCH', 'PUT', 'DELETE'], '/orders', handler);
    for (const path of [...CATALOG_POST_PATHS, ...honoAdapter.throwPaths]) {
      app.post(path, handler);
    }
    return serveHono(app, calls, idem.resumeThrough(app));
  },
};
