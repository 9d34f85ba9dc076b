import express5 from 'express';
import Koa3 from 'koa';
import { express4, expressAdapter } from '../conformance/apps/express.js';
import { fastifyAdapter } from '../conformance/apps/fastify.js';
import { fetchAdapter } from '../conformance/apps/fetch.js';
import { honoAdapter } from '../conformance/apps/hono.js';
import { Koa2, koaAdapter } from '../conformance/apps/koa.js';
import { nodeAdapter } from '../conformance/apps/node.js';
import { nestAdapter } from '../support/nest-harness.js';
import { describeAdapterFuzz } from './surface.js';

// Every adapter's catalog app, with a body parser in front and without where the framework has
// both setups: the middleware reads the body itself only without one.
for (const adapter of [
  nodeAdapter,
  expressAdapter('express 5 (express.json() first)', express5, true, true),
  expressAdapter('express 4 (no body parser)', express4, false, false),
  fastifyAdapter,
  honoAdapter,
  koaAdapter('koa 3 (@koa/bodyparser first)', Koa3, true),
  koaAdapter('koa 2 (no body parser)', Koa2, false),
  nestAdapter('nest 12 (express)', 'express'),
  nestAdapter('nest 12 (fastify)', 'fastify'),
  fetchAdapter,
]) {
  describeAdapterFuzz(adapter);
}
