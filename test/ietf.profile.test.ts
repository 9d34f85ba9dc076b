import { randomUUID } from 'node:crypto';
import http, { type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import express from 'express';
import { afterEach, describe, expect, it } from 'vitest';
import { idempotency as expressIdempotency } from '../src/adapters/express.js';
import { idempotency as nodeIdempotency } from '../src/adapters/node.js';
import { type IdempotencyOptions, IETF_DRAFT_ERRORS_URL } from '../src/core/index.js';
import { memoryStore } from '../src/stores/memory.js';
import { signal } from '../src/testing/signal.js';

/**
 * draft-ietf-httpapi-idempotency-key-header-07, §2.1–2.7, requirement by requirement, on
 * `profile: 'ietf'` (and `required: true`, as a route documented as needing the key), over
 * node:http and Express. Each check quotes the sentence it checks.
 */

type Options = Partial<IdempotencyOptions<IncomingMessage>>;
interface App {
  url: string;
  runs: () => number;
  /** Holds the next handler run until released. */
  hold: () => { running: Promise<void>; release: () => void };
}

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((done) => s.close(done))));
});

async function listen(server: Server): Promise<string> {
  servers.push(server);
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function counters() {
  let runs = 0;
  let held: { running: ReturnType<typeof signal>; gate: ReturnType<typeof signal> } | undefined;
  const work = async (body: unknown) => {
    runs += 1;
    const holding = held;
    held = undefined;
    if (holding) {
      holding.running.resolve();
      await holding.gate.promise;
    }
    return { status: 201, body: JSON.stringify({ run: runs, got: body }) };
  };
  const hold = () => {
    const h = { running: signal(), gate: signal() };
    held = h;
    return { running: h.running.promise, release: h.gate.resolve };
  };
  return { work, hold, runs: () => runs };
}

const adapters: Record<string, (options: Options) => Promise<App>> = {
  node: async (options) => {
    const c = counters();
    const guard = nodeIdempotency({ store: memoryStore(), profile: 'ietf', required: true, ...options });
    const server = http.createServer(
      guard(async (req: IncomingMessage & { body?: Buffer }, res: ServerResponse) => {
        const answer = await c.work(JSON.parse(req.body?.toString() || 'null'));
        res.writeHead(answer.status, { 'content-type': 'application/json' }).end(answer.body);
      }),
    );
    return { url: await listen(server), runs: c.runs, hold: c.hold };
  },
  express: async (options) => {
    const c = counters();
    const app = express();
    app.use(express.json());
    app.post(
      '/orders',
      expressIdempotency({ store: memoryStore(), profile: 'ietf', required: true, ...options }),
      async (req, res) => {
        const answer = await c.work(req.body);
        res.status(answer.status).type('application/json').send(answer.body);
      },
    );
    return { url: await listen(http.createServer(app)), runs: c.runs, hold: c.hold };
  },
};

const post = (app: App, body: unknown, key?: string, headers: Record<string, string> = {}) =>
  fetch(`${app.url}/orders`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(key === undefined ? {} : { 'idempotency-key': key }),
      ...headers,
    },
    body: JSON.stringify(body),
  });

/** A request held in its handler under a fresh key, and a duplicate of it answered meanwhile. */
async function duplicateWhileHeld(app: App) {
  const key = `"${randomUUID()}"`;
  const held = app.hold();
  const original = post(app, { a: 1 }, key);
  await held.running;
  const duplicate = await post(app, { a: 1 }, key);
  return { key, original, duplicate, release: () => held.release() };
}

/** Sends header lines as written (fetch joins repeated headers). */
function rawPost(app: App, headerLines: string[]): Promise<{ status: number; text: string }> {
  const { port } = new URL(app.url);
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), '127.0.0.1');
    let data = '';
    socket.on('data', (chunk) => {
      data += chunk;
    });
    socket.on('end', () => resolve({ status: Number(data.split(' ')[1]), text: data }));
    socket.on('error', reject);
    const body = '{"a":1}';
    socket.write(
      [
        'POST /orders HTTP/1.1',
        'Host: x',
        'Connection: close',
        'Content-Type: application/json',
        `Content-Length: ${body.length}`,
        ...headerLines,
        '',
        body,
      ].join('\r\n'),
    );
  });
}

const LINK = `<${IETF_DRAFT_ERRORS_URL}>; rel="describedby"`;

async function expectProblem(reply: Response, status: number, title: string) {
  expect(reply.status).toBe(status);
  expect(reply.headers.get('content-type')).toBe('application/problem+json');
  expect(reply.headers.get('link')).toBe(LINK);
  expect(await reply.json()).toMatchObject({ type: IETF_DRAFT_ERRORS_URL, title, status });
}

describe.each(Object.keys(adapters))("profile 'ietf' against the draft (-07), over %s", (name) => {
  const start = (options: Options = {}) => adapters[name]!(options);

  describe('§2.1 Syntax', () => {
    it('"Its value MUST be a String": a quoted sf-string is read as the key', async () => {
      const app = await start();
      const key = randomUUID();
      const first = await post(app, { a: 1 }, `"${key}"`);
      const again = await post(app, { a: 1 }, `"${key}"`);
      expect([first.status, again.status]).toEqual([201, 201]);
      expect(again.headers.get('idempotency-replayed')).toBe('true');
      expect(app.runs()).toBe(1);
    });

    it('"Clients MUST NOT include more than one Idempotency-Key header field": two are refused, the handler never runs', async () => {
      const app = await start();
      const reply = await rawPost(app, ['Idempotency-Key: "a"', 'Idempotency-Key: "b"']);
      expect(reply.status).toBe(400);
      expect(reply.text).toContain('appears more than once');
      expect(app.runs()).toBe(0);
    });

    it('one header whose value holds a comma outside quotes is not a String: refused, saying so', async () => {
      const app = await start();
      const reply = await rawPost(app, ['Idempotency-Key: abc,def']);
      expect(reply.status).toBe(400);
      expect(reply.text).toContain('a key is one sf-string');
      expect(reply.text).not.toContain('more than once');
      expect(app.runs()).toBe(0);
    });
  });

  describe('§2.2 Uniqueness of Idempotency Key', () => {
    it('"MUST NOT be reused with another request with a different request payload": a reuse never runs the handler', async () => {
      const app = await start();
      const key = `"${randomUUID()}"`;
      await post(app, { a: 1 }, key);
      await expectProblem(await post(app, { a: 2 }, key), 422, 'Idempotency-Key is already used');
      expect(app.runs()).toBe(1);
    });

    it('"Uniqueness of the key MUST be defined by the resource owner": the same key from two clients is two operations', async () => {
      const app = await start();
      const key = `"${randomUUID()}"`;
      await post(app, { a: 1 }, key, { authorization: 'Bearer alice' });
      const bob = await post(app, { a: 1 }, key, { authorization: 'Bearer bob' });
      expect(bob.headers.get('idempotency-replayed')).toBeNull();
      expect(app.runs()).toBe(2);
    });
  });

  describe('§2.3 Idempotency Key Validity and Expiry', () => {
    it('"The resource MAY enforce time based idempotency keys": after `ttl` the key names a new operation', async () => {
      const app = await start({ ttl: 1 });
      const key = `"${randomUUID()}"`;
      await post(app, { a: 1 }, key);
      // Retention of 1 ms: the next request finds the record expired (a store treats it as absent).
      await new Promise((done) => setTimeout(done, 20));
      const again = await post(app, { a: 1 }, key);
      expect(again.headers.get('idempotency-replayed')).toBeNull();
      expect(app.runs()).toBe(2);
    });
  });

  describe('§2.4 Idempotency Fingerprint', () => {
    it('"An idempotency fingerprint MAY be used": the same payload, reordered, is the same request', async () => {
      const app = await start();
      const key = `"${randomUUID()}"`;
      await post(app, { a: 1, b: 2 }, key);
      const reordered = await fetch(`${app.url}/orders`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: '{ "b": 2, "a": 1 }',
      });
      expect(reordered.headers.get('idempotency-replayed')).toBe('true');
      expect(app.runs()).toBe(1);
    });
  });

  describe('§2.5 Responsibilities', () => {
    it('"Resource server MUST publish idempotency related specification": every error links it (rel="describedby")', async () => {
      const app = await start({ docsUrl: 'https://developer.example.com/idempotency' });
      const reply = await post(app, { a: 1 });
      expect(reply.headers.get('link')).toBe(
        '<https://developer.example.com/idempotency>; rel="describedby"',
      );
      expect((await reply.json()).type).toBe('https://developer.example.com/idempotency');
    });
  });

  describe('§2.6 Idempotency Enforcement Scenarios', () => {
    it('"First time request … SHOULD process the request normally"', async () => {
      const app = await start();
      const reply = await post(app, { a: 1 }, `"${randomUUID()}"`);
      expect(reply.status).toBe(201);
      expect(app.runs()).toBe(1);
    });

    it('"Retry … SHOULD respond with the result of the previously completed operation"', async () => {
      const app = await start();
      const key = `"${randomUUID()}"`;
      const first = await post(app, { a: 1 }, key);
      const retry = await post(app, { a: 1 }, key);
      expect(retry.status).toBe(first.status);
      expect(await retry.text()).toBe(await first.text());
      expect(app.runs()).toBe(1);
    });

    it('"Concurrent Request … SHOULD respond with a resource conflict error"', async () => {
      const app = await start();
      const { original, duplicate, release } = await duplicateWhileHeld(app);
      release();
      expect((await original).status).toBe(201);
      expect(duplicate.status).toBe(409);
      expect(app.runs()).toBe(1);
    });
  });

  describe('§2.7 Error Scenarios', () => {
    it('"If the Idempotency-Key request header is missing … SHOULD reply with an HTTP 400 status code with body containing a link pointing to relevant documentation"', async () => {
      const app = await start();
      await expectProblem(await post(app, { a: 1 }), 400, 'Idempotency-Key is missing');
      expect(app.runs()).toBe(0);
    });

    it('"an attempt to reuse an idempotency key with a different request payload … SHOULD reply with a HTTP 422 status code with body containing a link"', async () => {
      const app = await start();
      const key = `"${randomUUID()}"`;
      await post(app, { a: 1 }, key);
      await expectProblem(await post(app, { a: 9 }, key), 422, 'Idempotency-Key is already used');
    });

    it('"If the request is retried, while the original request is still being processed … SHOULD reply with an HTTP 409 status code with body containing problem description": at once, with Retry-After', async () => {
      const app = await start();
      const { original, duplicate, release } = await duplicateWhileHeld(app);
      // Answered while the original is still held: the profile does not wait (`concurrency: 'reject'`).
      expect(Number(duplicate.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      await expectProblem(duplicate, 409, 'A request is outstanding for this Idempotency-Key');
      release();
      await original;
    });

    it('"Clients MUST correct the requests (with the exception of 409 …) … or the resource server MUST fail the request": an uncorrected reuse keeps failing; the 409 retried unchanged succeeds', async () => {
      const app = await start();
      const key = `"${randomUUID()}"`;
      await post(app, { a: 1 }, key);
      expect((await post(app, { a: 2 }, key)).status).toBe(422);
      expect((await post(app, { a: 2 }, key)).status).toBe(422);
      const { key: other, original, duplicate, release } = await duplicateWhileHeld(app);
      expect(duplicate.status).toBe(409);
      release();
      await original;
      const retried = await post(app, { a: 1 }, other);
      expect(retried.status).toBe(201);
      expect(retried.headers.get('idempotency-replayed')).toBe('true');
    });
  });
});
