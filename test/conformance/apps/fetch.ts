import { createServer } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { getRequestListener } from '@hono/node-server';
import { type FetchHandler, idempotency, idempotencyOf } from '../../../src/adapters/fetch.js';
import {
  type AdapterUnderTest,
  listen,
  type Planned,
  pacedStream,
  plan,
  type RunningApp,
} from '../../../src/testing/adapter-suite.js';

// The adapter suite's catalog served by the Web-standard fetch adapter: its conformance tests and the adapter fuzz
// (test/fuzz) run against this app.

/**
 * Serves a Web-standard handler on node:http. @hono/node-server does the node:http side (request
 * body streaming, draining an unread body, backpressure); the handler is given Node's own
 * `Request`, rebuilt from the one the server made, and its Node `Response` is written as is
 * (`overrideGlobalObjects: false` leaves Node's globals alone).
 */
function serveFetch(
  handler: FetchHandler,
  calls: Record<string, number>,
  resume?: RunningApp['resume'],
): Promise<RunningApp> {
  const listener = getRequestListener(
    (served: Request) =>
      handler(
        new Request(served.url, {
          method: served.method,
          headers: served.headers,
          body: served.body,
          signal: served.signal,
          duplex: 'half',
        } as RequestInit),
      ),
    { overrideGlobalObjects: false },
  );
  return listen(createServer(listener), calls, resume);
}

/** The catalog's answer, written the Web-standard way. */
function respond(planned: Exclude<Planned, { kind: 'fail' }>): Response {
  const init = { status: planned.status, headers: planned.headers };
  switch (planned.kind) {
    case 'json':
      return Response.json(planned.json, init);
    case 'text':
      return new Response(planned.text, init);
    case 'bytes':
      return new Response(new Uint8Array(planned.bytes), init);
    case 'empty':
      return new Response(null, init);
    case 'stream':
      return new Response(pacedStream(planned.chunks), init);
  }
}

export const fetchAdapter: AdapterUnderTest = {
  name: 'fetch (Node Request/Response)',
  throwPaths: ['/throw', '/reject'],
  async start({ scopeByAuthorization, ...options }) {
    const calls: Record<string, number> = {};
    const guard = idempotency({
      ...options,
      ...(scopeByAuthorization
        ? { scope: (request: Request) => request.headers.get('authorization') ?? '' }
        : {}),
    });
    const handler = guard((request: Request) => {
      const url = new URL(request.url);
      // A sync throw, as opposed to the async handler's rejected promise below.
      if (url.pathname === '/throw' && calls['POST /throw'] === undefined) {
        calls['POST /throw'] = 1;
        throw new Error('boom');
      }
      return (async () => {
        const received =
          url.pathname === '/form' ? Object.fromEntries(await request.formData()) : await request.text();
        const planned = plan(calls, request.method, url, idempotencyOf(request), received);
        if (planned.delayMs) await sleep(planned.delayMs);
        if (planned.kind === 'fail') throw new Error('boom');
        return respond(planned);
      })();
    });
    return serveFetch(handler, calls, guard.resumeThrough(handler));
  },
};
