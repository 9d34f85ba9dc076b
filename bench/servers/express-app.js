// One Express 5 app, one handler; CONTENDER picks the idempotency layer in front of it.
// Started in its own process by bench/run.js; reports its port over IPC.
import express from 'express';
import { serveCommands } from '../lib/proc.js';
import { delay, stats, work } from './work.js';

const CONTENDER = process.env.CONTENDER ?? 'bare';
const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
/** Every key or prefix this server writes contains RUN_ID, so run.js can delete them afterwards. */
const RUN_ID = process.env.RUN_ID ?? `rsbench-${process.pid}`;
const SQLITE_FILE = process.env.SQLITE_FILE;

async function handler(req, res) {
  res.status(201).json(await work(req.body));
}

const closers = [];

const contenders = {
  bare: async () => [handler],

  'express-idempotency-memory': () => expressIdempotency(undefined),

  'express-idempotency-redis': async () => {
    const { default: module } = await import('express-idempotency-redis-adapter');
    const RedisAdapter = module.default;
    const adapter = new RedisAdapter({ connectionConfig: { url: REDIS_URL } });
    await adapter.connect();
    closers.push(() => adapter.disconnect());
    return expressIdempotency(adapter);
  },

  'node-idempotency-memory': async () => {
    const { MemoryStorageAdapter } = await import('@node-idempotency/storage-adapter-memory');
    return nodeIdempotency(new MemoryStorageAdapter());
  },

  'node-idempotency-redis': async () => {
    const { RedisStorageAdapter } = await import('@node-idempotency/storage-adapter-redis');
    const storage = new RedisStorageAdapter({ url: REDIS_URL });
    await storage.connect();
    closers.push(() => storage.disconnect());
    return nodeIdempotency(storage);
  },

  'powertools-redis': async () => {
    const { makeIdempotent, IdempotencyConfig } = await import('@aws-lambda-powertools/idempotency');
    const { CachePersistenceLayer } = await import('@aws-lambda-powertools/idempotency/cache');
    const { createClient } = await import('@redis/client');
    const client = await createClient({ url: REDIS_URL }).connect();
    closers.push(() => client.quit());
    const idempotent = makeIdempotent(async ({ body }) => ({ status: 201, body: await work(body) }), {
      persistenceStore: new CachePersistenceLayer({ client }),
      keyPrefix: RUN_ID,
      // Payload validation on: without it a same-key-different-body request silently gets the
      // first request's response.
      config: new IdempotencyConfig({ eventKeyJmesPath: 'key', payloadValidationJmesPath: 'body' }),
    });
    const statusOf = (error) =>
      ({
        IdempotencyAlreadyInProgressError: 409,
        IdempotencyValidationError: 422,
        IdempotencyKeyError: 400,
      })[error?.name] ?? 500;
    return [
      async function powertools(req, res) {
        try {
          const result = await idempotent({ key: req.get('idempotency-key'), body: req.body });
          res.status(result.status).json(result.body);
        } catch (error) {
          res.status(statusOf(error)).json({ error: error?.name ?? 'error', message: error?.message });
        }
      },
    ];
  },

  'retrysafe-memory': async () => {
    const { memoryStore } = await import('retrysafe/memory');
    return retrysafe(memoryStore());
  },

  'retrysafe-redis': async () => {
    const { redisStore } = await import('retrysafe/redis');
    const { default: Redis } = await import('ioredis');
    const client = new Redis(REDIS_URL);
    closers.push(() => client.quit());
    return retrysafe(redisStore({ client, prefix: `${RUN_ID}:` }));
  },

  'retrysafe-sqlite': async () => {
    const { sqliteStore } = await import('retrysafe/sqlite');
    return retrysafe(sqliteStore({ url: SQLITE_FILE, migrate: true }));
  },
};

async function expressIdempotency(dataAdapter) {
  const { idempotency, getSharedIdempotencyService } = await import('express-idempotency');
  const middleware = idempotency(dataAdapter ? { dataAdapter } : {});
  const service = getSharedIdempotencyService();
  // The library calls next() even after replaying; its documented contract is that the handler
  // checks isHit() and stops.
  return [
    middleware,
    function skipHits(req, _res, next) {
      if (service.isHit(req)) return;
      next();
    },
    handler,
  ];
}

// @node-idempotency/express (the library's own Express glue) is not published on npm; this is the
// same integration over @node-idempotency/core: onRequest before the handler, onResponse from
// res.send, replay of the stored status and body, errors mapped as the library's plugins map them.
async function nodeIdempotency(storage) {
  const { Idempotency, IdempotencyError } = await import('@node-idempotency/core');
  const idempotency = new Idempotency(storage, { cacheKeyPrefix: RUN_ID });
  const statusByCode = {
    IDEMPOTENCY_KEY_LEN_EXEEDED: 400,
    IDEMPOTENCY_KEY_MISSING: 400,
    IDEMPOTENCY_FINGERPRINT_MISSMATCH: 422,
    REQUEST_IN_PROGRESS: 409,
  };
  return [
    async function nodeIdempotencyMiddleware(req, res, next) {
      const params = { headers: req.headers, body: req.body, path: req.url, method: req.method };
      let cached;
      try {
        cached = await idempotency.onRequest(params);
      } catch (error) {
        if (!(error instanceof IdempotencyError)) throw error;
        res.status(statusByCode[error.code] ?? 500).json({ error: error.code });
        return;
      }
      if (!cached) {
        const send = res.send.bind(res);
        res.send = (payload) => {
          const { statusCode } = res;
          let parsed = payload;
          try {
            parsed = typeof payload === 'string' ? JSON.parse(payload) : payload;
          } catch {}
          idempotency
            .onResponse(params, {
              additional: { statusCode },
              ...(statusCode < 400 ? { body: parsed } : { error: parsed }),
            })
            .catch(() => {});
          return send(payload);
        };
        next();
        return;
      }
      res.status(cached.additional?.statusCode ?? 200).set('idempotent-replayed', 'true');
      res.json(cached.body ?? cached.error);
    },
    handler,
  ];
}

async function retrysafe(store) {
  const { idempotency } = await import('retrysafe/express');
  closers.push(() => store.close());
  return [idempotency({ store }), handler];
}

const build = contenders[CONTENDER];
if (!build) throw new Error(`unknown CONTENDER ${CONTENDER}`);

try {
  const app = express();
  app.disable('x-powered-by');
  app.use(express.json());
  app.get('/__stats', (_req, res) => res.json(stats()));
  app.post('/orders', ...(await build()));
  app.use((error, _req, res, _next) => {
    const status = error?.status ?? error?.statusCode ?? (res.statusCode >= 400 ? res.statusCode : 500);
    if (res.headersSent) return;
    res.status(status).json({ error: error?.message ?? 'error' });
  });
  const server = app.listen(0, '127.0.0.1', () => process.send?.({ ready: server.address().port }));
  serveCommands({ stats, delay });
  process.on('SIGTERM', async () => {
    server.close();
    server.closeAllConnections();
    await Promise.allSettled(closers.map((close) => close()));
    process.exit(0);
  });
} catch (error) {
  process.send?.({ failed: String(error?.message ?? error) });
  process.exit(1);
}
