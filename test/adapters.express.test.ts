import { randomUUID } from 'node:crypto';
import http from 'node:http';
import { PassThrough, pipeline, Readable } from 'node:stream';
import { gunzipSync } from 'node:zlib';
import compression from 'compression';
import express5, { type NextFunction, type Request, type Response } from 'express';
import { beforeAll, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/express.js';
import { dictionaryModePays } from '../src/adapters/kit/node-http.js';
import type { IdempotencyError } from '../src/core/contract/index.js';
import {
  describeAdapterConformance,
  listen,
  type RunningApp,
  settled,
  uploadFromAnotherThread,
} from '../src/testing/adapter-suite.js';
import { type Express, express4, expressAdapter } from './conformance/apps/express.js';
import { describeAdapterSpecifics, postJson } from './support/adapter-specifics.js';
import { catalogPage, RETRIES_WITHOUT_GZIP } from './support/compression.js';
import { memory, postgres, sqlite } from './support/store-factories.js';

describeAdapterConformance(expressAdapter('express 5 (express.json() first)', express5, true, true), [
  memory,
  sqlite,
  postgres,
]);
describeAdapterConformance(expressAdapter('express 4 (no body parser)', express4, false, false), [
  memory,
  sqlite,
]);
describeAdapterConformance(expressAdapter('express 4 (express.json() first)', express4, true, false), [
  memory,
]);
describeAdapterConformance(expressAdapter('express 5 (no body parser)', express5, false, true), [memory]);

/**
 * POST /compressed with `accept-encoding` as given (none when undefined), over node:http: fetch
 * always sends one of its own and decodes what comes back.
 */
function compressedPost(
  app: RunningApp,
  key: string,
  acceptEncoding: string | undefined,
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const headers: http.OutgoingHttpHeaders = { 'content-type': 'application/json', 'idempotency-key': key };
    if (acceptEncoding !== undefined) headers['accept-encoding'] = acceptEncoding;
    const req = http.request(`${app.url}/compressed`, { method: 'POST', headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end('{}');
  });
}

describeAdapterSpecifics('express specifics', idempotency, (store, started) => {
  async function start(express: Express, build: (app: ReturnType<Express>) => void): Promise<RunningApp> {
    const app = express();
    build(app);
    return started(await listen(http.createServer(app), {}));
  }

  const echo = (req: Request, res: Response) =>
    res.status(201).json({
      body: Buffer.isBuffer(req.body) ? `buffer:${req.body.toString()}` : req.body,
      key: req.idempotency?.key ?? null,
    });

  for (const [version, express] of [
    ['5', express5],
    ['4', express4],
  ] as const) {
    describe(`express ${version}`, () => {
      let app: RunningApp;
      beforeAll(async () => {
        app = await start(express, (a) => {
          a.post('/required', express.json(), idempotency({ store, required: true }), echo);
          a.post('/optional', express.json(), idempotency({ store }), echo);
          const api = express.Router();
          api.use(express.json(), idempotency({ store }));
          api.post('/a', echo);
          api.post('/b', echo);
          a.use('/api', api);
          a.post(
            '/next-errors',
            express.json(),
            idempotency({ store, required: true, renderErrors: false }),
            echo,
          );
          a.post('/next-errors-raw', idempotency({ store, renderErrors: false }), echo);
          a.post(
            '/next-errors-custom',
            express.json(),
            idempotency({ store, required: true, renderErrors: false }),
            echo,
          );
          a.post('/piped', idempotency({ store }), (_req, res) => {
            res.status(201).type('text/plain');
            Readable.from(['one ', 'two ', 'three']).pipe(res);
          });
          const noTenant = () => {
            throw Object.assign(new Error('no tenant'), { status: 401 });
          };
          a.post('/scope-throws', idempotency({ store, scope: noTenant }), echo);
          a.post('/scope-throws-parsed', express.json(), idempotency({ store, scope: noTenant }), echo);
          a.post('/validation', express.json(), idempotency({ store }), () => {
            throw Object.assign(new Error('bad isbn'), { status: 422 });
          });
          // compression() after the middleware: what the middleware captures is already gzip.
          a.post(
            '/compressed',
            express.json(),
            idempotency({ store }),
            compression({ threshold: 0 }),
            (_req, res) => res.status(201).json(catalogPage),
          );
          a.post(
            '/max-listeners',
            (req, res, next) => {
              req.setMaxListeners(7);
              res.setMaxListeners(42);
              next();
            },
            express.json(),
            idempotency({ store }),
            (req, res) => res.status(201).json([req.getMaxListeners(), res.getMaxListeners()]),
          );
          a.post('/forbidden', express.json(), idempotency({ store }), () => {
            throw Object.assign(new Error('not yours'), { status: 403 });
          });
          a.use('/next-errors-custom', ((error: IdempotencyError, _req, res, _next) => {
            res.status(error.statusCode).set(error.headers).json({ custom: error.code });
          }) as (error: IdempotencyError, req: Request, res: Response, next: NextFunction) => void);
          a.use(((error: { status?: number }, _req, res, _next) => {
            res.status(error.status ?? 500).json({ error: 'app_error' });
          }) as (error: { status?: number }, req: Request, res: Response, next: NextFunction) => void);
        });
      });

      it('per-route options: `required` on one route, optional on another', async () => {
        const missing = await postJson(app, '/required');
        expect(missing.status).toBe(400);
        expect(JSON.parse(missing.text)).toMatchObject({ error: 'idempotency_key_missing' });
        expect((await postJson(app, '/optional')).status).toBe(201);
      });

      it('req and res keep the max listeners set before the middleware (it re-adds that property)', async () => {
        expect(JSON.parse((await postJson(app, '/max-listeners', `listeners-${version}`)).text)).toEqual([
          7, 42,
        ]);
      });

      it('under a router, the fingerprint uses the full path: /api/a and /api/b conflict', async () => {
        expect((await postJson(app, '/api/a', `router-${version}`)).status).toBe(201);
        expect((await postJson(app, '/api/b', `router-${version}`)).status).toBe(409);
      });

      it('renderErrors: false hands the IdempotencyError to the error middleware', async () => {
        const custom = await postJson(app, '/next-errors-custom');
        expect(custom.status).toBe(400);
        expect(JSON.parse(custom.text)).toEqual({ custom: 'idempotency_key_missing' });
        const generic = await postJson(app, '/next-errors');
        expect(generic.status).toBe(400);
        expect(JSON.parse(generic.text)).toEqual({ error: 'app_error' });
      });

      it("a `scope` that throws reaches the app's error middleware, with or without express.json() first", async () => {
        for (const path of ['/scope-throws', '/scope-throws-parsed']) {
          const reply = await postJson(app, path, `scope-${version}`);
          expect(reply.status, path).toBe(401);
          expect(JSON.parse(reply.text), path).toEqual({ error: 'app_error' });
        }
      });

      it('renderErrors: false, no parser: the 413 the error middleware renders for a 5 MB upload arrives, never a reset', async () => {
        const outcomes = await uploadFromAnotherThread(app, '/next-errors-raw', 10, 5_000_000);
        expect(outcomes).toEqual(Array(10).fill(413));
      });

      it('a stream piped into res is captured and replayed', async () => {
        const first = await postJson(app, '/piped', `piped-${version}`);
        expect([first.status, first.text]).toEqual([201, 'one two three']);
        const replay = await postJson(app, '/piped', `piped-${version}`);
        expect(replay.headers.get('idempotency-replayed')).toBe('true');
        expect(replay.text).toBe('one two three');
        expect(replay.headers.get('content-type')).toBe(first.headers.get('content-type'));
      });

      it('a 4xx the error middleware renders for a thrown error is what is stored and replayed', async () => {
        const first = await postJson(app, '/forbidden', `forbidden-${version}`);
        expect(first.status).toBe(403);
        const replay = await postJson(app, '/forbidden', `forbidden-${version}`);
        expect(replay.status).toBe(403);
        expect(replay.headers.get('idempotency-replayed')).toBe('true');
      });

      it('compression() after the middleware: the replay keeps content-encoding and decodes to the same JSON', async () => {
        const key = `compressed-${version}`;
        const first = await compressedPost(app, key, 'gzip');
        expect(first.status).toBe(201);
        expect(first.headers['content-encoding']).toBe('gzip');
        const replay = await compressedPost(app, key, 'gzip');
        expect(replay.headers['idempotency-replayed']).toBe('true');
        expect(replay.headers['content-encoding']).toBe('gzip');
        expect(replay.headers.vary).toBe(first.headers.vary);
        expect(JSON.parse(gunzipSync(replay.body).toString())).toEqual(catalogPage);
        expect(JSON.parse(gunzipSync(first.body).toString())).toEqual(catalogPage);
      });

      it.each(RETRIES_WITHOUT_GZIP)(
        'compression() after the middleware: a retry accepting %s gets the replay decoded',
        async (name, accept) => {
          const key = `compressed-${version}-${name.replaceAll(' ', '-')}`;
          const first = await compressedPost(app, key, 'gzip');
          expect(first.headers['content-encoding']).toBe('gzip');
          const replay = await compressedPost(app, key, accept);
          expect(replay.status).toBe(201);
          expect(replay.headers['idempotency-replayed']).toBe('true');
          expect(replay.headers['content-encoding']).toBeUndefined();
          expect(replay.headers['content-length']).toBe(String(replay.body.byteLength));
          expect(replay.headers.vary).toBe(first.headers.vary);
          expect(JSON.parse(replay.body.toString())).toEqual(catalogPage);
        },
      );

      it('a 422 the error middleware renders is answered but not stored: the retry runs again', async () => {
        expect((await postJson(app, '/validation', `validation-${version}`)).status).toBe(422);
        const again = await postJson(app, '/validation', `validation-${version}`);
        expect(again.status).toBe(422);
        expect(again.headers.get('idempotency-replayed')).toBeNull();
      });
    });
  }

  it.each([
    ['pipe()', (source: Readable, res: Response) => source.pipe(res)],
    ['pipeline()', (source: Readable, res: Response) => pipeline(source, res, () => undefined)],
  ])(
    'a client that hangs up while a body sent by %s is held: its key is released, not held for ever',
    async (_name, pipeTo) => {
      for (const express of [express5, express4]) {
        let piping!: () => void;
        const piped = new Promise<void>((resolve) => {
          piping = resolve;
        });
        const app = await start(express, (a) =>
          a.post('/held', express.json(), idempotency({ store, lease: '1h' }), (_req, res) => {
            // A body still coming when the client leaves: the pipe then lets go of the response.
            const source = new PassThrough();
            source.write('part');
            pipeTo(source, res);
            piping();
          }),
        );
        const key = `held-${randomUUID()}`;
        const headers = { 'content-type': 'application/json', 'idempotency-key': key };
        const req = http.request(`${app.url}/held`, { method: 'POST', headers });
        req.on('error', () => undefined);
        req.end('{}');
        await piped;
        req.destroy();
        await settled(store, key);
      }
    },
  );

  it('without an error middleware, a default Express app still answers engine errors as JSON', async () => {
    for (const express of [express5, express4]) {
      const app = await start(express, (a) => a.post('/x', idempotency({ store, required: true }), echo));
      const reply = await postJson(app, '/x');
      expect(reply.status).toBe(400);
      expect(reply.headers.get('content-type')).toMatch(/^application\/json/);
      expect(JSON.parse(reply.text)).toMatchObject({ error: 'idempotency_key_missing' });
    }
  });
});

// The bench's tricks scenario measured toDictionaryMode on the guarded Express path: about half
// the time per request on Node 20 and 22, a third more on Node 24 (bench/results/2026-12-05-tricks-node22.md).
describe('toDictionaryMode', () => {
  it('runs only on the Node lines where it was measured to pay', () => {
    expect(['20.20.2', '22.23.5', '23.11.1'].map(dictionaryModePays)).toEqual([true, true, true]);
    expect(['24.0.0', '24.22.0', '25.2.1'].map(dictionaryModePays)).toEqual([false, false, false]);
    expect(dictionaryModePays(undefined)).toBe(false); // workerd has no process.versions
  });
});
