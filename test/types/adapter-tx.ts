// The Tx convention, adapter by adapter (checked by `tsc --noEmit`, strict; nothing here runs).
// Each adapter's options are `XIdempotencyOptions<Tx = RegisteredTx>` and each factory is generic
// in `Tx`, so `Tx` is inferred from the store. Where the framework lets a type flow from the
// middleware to the handler (node:http's handler, a Hono route naming the middleware, Koa's state,
// Nest's interceptor), the handler's `tx` is the store's; where the context is reached through a
// global declaration of the framework (Express's req, Fastify's request, Hono after `app.use`) or
// a free function (retrysafe/fetch's `idempotencyOf`), it is the registered one.
//
// The store used here is PostgreSQL's (`PoolClient`), while developer-types.ts registers
// better-sqlite3's `Database`: a `tx` that is the store's was inferred, not registered.
import type Database from 'better-sqlite3';
import express from 'express';
import Fastify from 'fastify';
import { Hono } from 'hono';
import Koa from 'koa';
import type { PoolClient } from 'pg';
import {
  type ExpressIdempotencyOptions,
  idempotency as expressIdempotency,
} from '../../src/adapters/express.js';
import {
  type FastifyIdempotencyOptions,
  idempotency as fastifyIdempotency,
} from '../../src/adapters/fastify.js';
import {
  type FetchIdempotencyOptions,
  idempotency as fetchIdempotency,
  idempotencyOf,
} from '../../src/adapters/fetch.js';
import { type HonoIdempotencyOptions, idempotency as honoIdempotency } from '../../src/adapters/hono.js';
import { type KoaIdempotencyOptions, idempotency as koaIdempotency } from '../../src/adapters/koa.js';
import {
  IdempotencyInterceptor,
  type NestIdempotencyOptions,
  RetrysafeModule,
} from '../../src/adapters/nestjs.js';
import { type NodeIdempotencyOptions, idempotency as nodeIdempotency } from '../../src/adapters/node.js';
import type { AtomicStore, IdempotencyStore } from '../../src/core/store.js';
import { postgresStore } from '../../src/stores/postgres/index.js';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function assertType<T extends true>(_: T): void {}

const pg = postgresStore({ url: 'postgres://localhost/test' });
type PgTx = PoolClient | undefined;
type RegisteredTxOrNone = Database.Database | undefined;

// Every adapter's options default to the registered transaction type.
type Registered = IdempotencyStore | AtomicStore<Database.Database>;
assertType<Equal<ExpressIdempotencyOptions['store'], Registered>>(true);
assertType<Equal<FastifyIdempotencyOptions['store'], Registered>>(true);
assertType<Equal<FetchIdempotencyOptions['store'], Registered>>(true);
assertType<Equal<HonoIdempotencyOptions['store'], Registered>>(true);
assertType<Equal<KoaIdempotencyOptions['store'], Registered>>(true);
assertType<Equal<NestIdempotencyOptions['store'], Registered>>(true);
assertType<Equal<NodeIdempotencyOptions['store'], Registered>>(true);
// And each takes the store's type when named.
assertType<Equal<KoaIdempotencyOptions<PoolClient>['store'], IdempotencyStore | AtomicStore<PoolClient>>>(
  true,
);
assertType<Equal<FastifyIdempotencyOptions<PoolClient>['store'], IdempotencyStore | AtomicStore<PoolClient>>>(
  true,
);

// node:http: the handler's `idem.tx` is the store's.
nodeIdempotency({ store: pg, mode: 'atomic' })(async (_req, res, idem) => {
  assertType<Equal<NonNullable<typeof idem>['tx'], PgTx>>(true);
  res.end();
});

// Hono: a route naming the middleware sees the store's.
new Hono().post('/loans', honoIdempotency({ store: pg, mode: 'atomic' }), (c) => {
  const idem = c.get('idempotency');
  assertType<Equal<NonNullable<typeof idem>['tx'], PgTx>>(true);
  return c.body(null, 204);
});

// Koa: the middleware adds `idempotency` to the state of the app (or router) it is used on.
new Koa().use(koaIdempotency({ store: pg, mode: 'atomic' })).use((ctx) => {
  assertType<Equal<NonNullable<typeof ctx.state.idempotency>['tx'], PgTx>>(true);
});

// Nest: the interceptor is typed by the store (a parameter decorator carries no type: a route
// annotates `@IdempotencyCtx() idem: IdempotencyContext<PoolClient>` itself).
const interceptor = new IdempotencyInterceptor({ store: pg, mode: 'atomic' });
assertType<Equal<typeof interceptor, IdempotencyInterceptor<PoolClient>>>(true);
RetrysafeModule.forRoot({ store: pg, mode: 'atomic' });
RetrysafeModule.forRootAsync({ useFactory: () => ({ store: pg, mode: 'atomic' as const }) });

// Express and Fastify: the context lives on the framework's global request type, which no
// factory's `Tx` reaches: it is the registered one, whichever store is given.
express().post('/loans', expressIdempotency({ store: pg, mode: 'atomic' }), (req, res) => {
  assertType<Equal<NonNullable<typeof req.idempotency>['tx'], RegisteredTxOrNone>>(true);
  res.end();
});
const fastify = Fastify();
fastify.register(fastifyIdempotency, { store: pg, mode: 'atomic' });
fastify.post('/loans', async (request) => {
  assertType<Equal<NonNullable<typeof request.idempotency>['tx'], RegisteredTxOrNone>>(true);
  return null;
});

// retrysafe/fetch: `idempotencyOf` is the registered one, or the one it is asked for.
fetchIdempotency({ store: pg, mode: 'atomic' })(async (request: Request) => {
  const registered = idempotencyOf(request);
  assertType<Equal<NonNullable<typeof registered>['tx'], RegisteredTxOrNone>>(true);
  const idem = idempotencyOf<PoolClient>(request);
  assertType<Equal<NonNullable<typeof idem>['tx'], PgTx>>(true);
  return new Response(null, { status: 204 });
});
