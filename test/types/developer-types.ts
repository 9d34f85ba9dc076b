// Checked by `tsc --noEmit` (strict): each `@ts-expect-error` must meet an error, and every other
// line must compile. Nothing here runs.
import type Database from 'better-sqlite3';
import express from 'express';
import Fastify from 'fastify';
import { Hono } from 'hono';
import { idempotency as expressIdempotency } from '../../src/adapters/express.js';
import { idempotency as fastifyIdempotency } from '../../src/adapters/fastify.js';
import { idempotency as honoIdempotency } from '../../src/adapters/hono.js';
import { idempotency as nodeIdempotency } from '../../src/adapters/node.js';
import { createIdempotency } from '../../src/core/adapter.js';
import { type Duration, idempotency as misplacedIdempotency } from '../../src/core/index.js';
import { memoryStore } from '../../src/stores/memory.js';
import { type SqliteDatabase, sqliteStore } from '../../src/stores/sqlite/index.js';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function assertType<T extends true>(_: T): void {}

const store = memoryStore();
// Naming the driver types the transaction as that driver's connection; without one it is either.
const sqlite = sqliteStore({ url: ':memory:', driver: 'better-sqlite3', migrate: true });
assertType<Equal<ReturnType<typeof sqliteStore>['database'], SqliteDatabase>>(true);

// Durations: a number of ms or a string `ms` understands; typos fail to compile.
createIdempotency({ store, ttl: '7d', lease: '10 s', wait: 250, storeTimeout: '5s' });
// @ts-expect-error '7dd' is not a duration
createIdempotency({ store, ttl: '7dd' });
// @ts-expect-error 'soon' is not a duration
const soon: Duration = 'soon';

// `idempotency` from 'retrysafe' (not a framework's entry) does not compile, its parameter's type
// saying where it lives.
// @ts-expect-error idempotency() comes from a framework's entry, e.g. 'retrysafe/express'
misplacedIdempotency({ store });
assertType<
  Parameters<typeof misplacedIdempotency>[0] extends `${string}'retrysafe/express'${string}` ? true : false
>(true);

// Hono: `c.get('idempotency')` compiles with `app.use` (ContextVariableMap), and a route that
// names the middleware sees the store's transaction type.
const hono = new Hono();
hono.use('/orders', honoIdempotency({ store }));
hono.post('/orders', (c) => c.json({ key: c.get('idempotency')?.key ?? null }, 201));
hono.post('/loans', honoIdempotency({ store: sqlite, mode: 'atomic' }), (c) => {
  const idem = c.get('idempotency');
  assertType<Equal<NonNullable<typeof idem>['tx'], Database.Database | undefined>>(true);
  return c.body(null, 204);
});

// node:http: the handler's `idem.tx` is the store's transaction.
nodeIdempotency({ store: sqlite, mode: 'atomic' })(async (_req, res, idem) => {
  assertType<Equal<NonNullable<typeof idem>['tx'], Database.Database | undefined>>(true);
  res.end();
});

// Express and Fastify: `req.idempotency` is declared on the framework's global request type, so
// its `tx` is the type the project registers (see the declaration below).
const app = express();
app.post('/loans', express.json(), expressIdempotency({ store: sqlite, mode: 'atomic' }), (req, res) => {
  assertType<Equal<NonNullable<typeof req.idempotency>['tx'], Database.Database | undefined>>(true);
  res.end();
});
const fastify = Fastify();
fastify.register(fastifyIdempotency, { store: sqlite, mode: 'atomic' });
fastify.post('/loans', async (request) => {
  assertType<Equal<NonNullable<typeof request.idempotency>['tx'], Database.Database | undefined>>(true);
  return null;
});

declare module '../../src/core/index.js' {
  interface Register {
    tx: Database.Database;
  }
}

export { soon };
