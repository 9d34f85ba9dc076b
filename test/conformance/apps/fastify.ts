import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { idempotency } from '../../../src/adapters/fastify.js';
import {
  type AdapterUnderTest,
  CATALOG_POST_PATHS,
  type Planned,
  paced,
  plan,
  type RunningApp,
} from '../../../src/testing/adapter-suite.js';

// The adapter suite's catalog served by Fastify: its conformance tests and the adapter fuzz
// (test/fuzz) run against this app.

async function listenFastify(app: FastifyInstance, calls: Record<string, number>): Promise<RunningApp> {
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    calls,
    resume: idempotency.resumeThrough(app),
    close: () => app.close(),
  };
}

function answer(reply: FastifyReply, planned: Exclude<Planned, { kind: 'fail' }>): unknown {
  reply.code(planned.status).headers(planned.headers);
  switch (planned.kind) {
    case 'json':
      return planned.json;
    case 'text':
      return planned.text;
    case 'bytes':
      return planned.bytes;
    case 'empty':
      return reply.send();
    case 'stream':
      return Readable.from(paced(planned.chunks));
  }
}

export const fastifyAdapter: AdapterUnderTest = {
  name: 'fastify',
  throwPaths: ['/throw', '/throw-sync', '/throw-send'],
  async start({ scopeByAuthorization, ...options }) {
    const calls: Record<string, number> = {};
    const app = Fastify();
    await app.register(idempotency, {
      ...options,
      ...(scopeByAuthorization ? { scope: (request) => request.headers.authorization ?? '' } : {}),
    });
    const planFor = (request: FastifyRequest) =>
      plan(calls, request.method, new URL(request.url, 'http://x'), request.idempotency, request.body);
    app.post('/throw', async (request, reply) => {
      const planned = planFor(request);
      await sleep(1);
      if (planned.kind === 'fail') throw new Error('boom');
      return answer(reply, planned);
    });
    app.post('/throw-sync', (request, reply) => {
      const planned = planFor(request);
      if (planned.kind === 'fail') throw new Error('boom');
      reply.send(answer(reply, planned));
    });
    app.post('/throw-send', (request, reply) => {
      const planned = planFor(request);
      reply.send(planned.kind === 'fail' ? new Error('boom') : answer(reply, planned));
    });
    const handler = async (request: FastifyRequest, reply: FastifyReply) => {
      const planned = planFor(request);
      if (planned.delayMs) await sleep(planned.delayMs);
      if (planned.kind === 'fail') throw new Error('unexpected');
      return answer(reply, planned);
    };
    app.route({ method: ['GET', 'POST', 'PATCH', 'PUT', 'DELETE'], url: '/orders', handler });
    // Fastify parses only JSON and text itself: a form parser is the app's to add.
    app.addContentTypeParser(
      'application/x-www-form-urlencoded',
      { parseAs: 'string' },
      (_request, body, done) => done(null, Object.fromEntries(new URLSearchParams(body as string))),
    );
    for (const url of CATALOG_POST_PATHS) app.post(url, handler);
    return listenFastify(app, calls);
  },
};
