import http from 'node:http';
import { createRequire } from 'node:module';
import { setTimeout as sleep } from 'node:timers/promises';
import type express5 from 'express';
import type { Request, Response } from 'express';
import { idempotency } from '../../../src/adapters/express.js';
import {
  type AdapterUnderTest,
  CATALOG_POST_PATHS,
  listen,
  type Planned,
  paced,
  plan,
} from '../../../src/testing/adapter-suite.js';

// The adapter suite's catalog served by Express (4 and 5, with express.json() in front or no parser): its conformance tests and the adapter fuzz
// (test/fuzz) run against this app.

// Express 4 is installed under an alias (npm:express@4); its API is the subset typed here.
export const express4 = createRequire(import.meta.url)('express4') as typeof express5;

export type Express = typeof express5;

function answer(res: Response, planned: Exclude<Planned, { kind: 'fail' }>): Promise<void> | undefined {
  res.status(planned.status).set(planned.headers);
  switch (planned.kind) {
    case 'json':
      return void res.json(planned.json);
    case 'text':
      return void res.send(planned.text);
    case 'bytes':
      return void res.send(planned.bytes);
    case 'empty':
      return void res.end();
    case 'stream':
      return (async () => {
        for await (const chunk of paced(planned.chunks)) res.write(chunk);
        res.end();
      })();
  }
}

const urlOf = (req: Request) => new URL(req.originalUrl, 'http://x');

/**
 * `parser`: mount `express.json()` and `express.urlencoded()` before the middleware (the usual
 * setup, fingerprint from the parsed body) or nothing (the middleware reads the raw body into
 * `req.body`, and `/parser-after` mounts `express.json()` after it).
 */
export function expressAdapter(
  name: string,
  express: Express,
  parser: boolean,
  asyncThrow: boolean,
): AdapterUnderTest {
  return {
    name,
    throwPaths: ['/throw', '/throw-next', ...(asyncThrow ? ['/throw-async'] : [])],
    bodyParsers: parser ? 'before' : 'after',
    async start({ scopeByAuthorization, ...options }) {
      const calls: Record<string, number> = {};
      const app = express();
      if (parser) app.use(express.json({ limit: '10mb' }), express.urlencoded({ extended: false }));
      const idem = idempotency({
        ...options,
        ...(scopeByAuthorization ? { scope: (req) => req.get('authorization') ?? '' } : {}),
      });
      app.use(idem);
      const planFor = (req: Request) => plan(calls, req.method, urlOf(req), req.idempotency, req.body);
      app.post('/throw', (req, res) => {
        const planned = planFor(req);
        if (planned.kind === 'fail') throw new Error('boom');
        return answer(res, planned);
      });
      app.post('/throw-next', (req, res, next) => {
        const planned = planFor(req);
        if (planned.kind === 'fail') return next(new Error('boom'));
        return answer(res, planned);
      });
      app.post('/throw-async', async (req, res) => {
        const planned = planFor(req);
        await sleep(1);
        if (planned.kind === 'fail') throw new Error('boom');
        return answer(res, planned);
      });
      if (!parser) app.post('/parser-after', express.json());
      app.all(['/orders', ...CATALOG_POST_PATHS, '/parser-after'], (req, res, next) => {
        const planned = planFor(req);
        if (planned.kind === 'fail') return next(new Error('unexpected'));
        void sleep(planned.delayMs ?? 0)
          .then(() => answer(res, planned))
          .catch(next);
      });
      return listen(http.createServer(app), calls, idem.resumeThrough(app));
    },
  };
}
