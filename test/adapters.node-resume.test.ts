import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/node.js';
import { resumeAbandoned } from '../src/core/index.js';
import type { IdempotencyStore } from '../src/core/store.js';
import { memoryStore } from '../src/stores/memory.js';
import { memory, mysql, postgres, redis, sqlite } from './support/store-factories.js';

const store = memoryStore();
const seen: unknown[] = [];
let failCharges = true;
const guarded = idempotency({ store, lease: 200 })(async (req, res, idem) => {
  if (!idem) return void res.writeHead(400).end();
  seen.push({
    method: req.method,
    url: req.url,
    type: req.headers['content-type'],
    key: req.headers['idempotency-key'],
    body: req.body.toString(),
  });
  const fine = await idem.step('recorded', () => ({ id: randomUUID() }));
  const charge = await idem.step('charged', () => {
    if (failCharges) throw new Error('provider down');
    return { chargeId: 'ch_1' };
  });
  res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ ...fine, ...charge }));
});
const server = http.createServer(guarded).listen(0, '127.0.0.1');
await once(server, 'listening');
const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/fines`;
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

const post = (key: string) =>
  fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: '{"member":"U-1"}',
  });

it("guarded.resume re-drives the handler from the saved request; the client's late retry replays it", async () => {
  const key = randomUUID();
  expect((await post(key)).status).toBe(500);
  failCharges = false;
  await sleep(5);
  let outcome: unknown;
  expect(
    await resumeAbandoned({ store, resume: async (record) => (outcome = await guarded.resume(record)) }),
  ).toBe(1);
  expect(outcome).toMatchObject({ kind: 'executed', response: { status: 201 } });
  const request = { method: 'POST', url: '/fines', type: 'application/json', key, body: '{"member":"U-1"}' };
  expect(seen).toEqual([request, request]);
  const late = await post(key);
  expect(late.status).toBe(201);
  expect(late.headers.get('idempotency-replayed')).toBe('true');
  const body = await late.json();
  expect(body).toMatchObject({ chargeId: 'ch_1' });
  expect(body.id).toBe(
    JSON.parse(Buffer.from((outcome as { response: { body: Uint8Array } }).response.body).toString()).id,
  );
  expect(seen).toHaveLength(2);
});

// Issue 32, item 2: two guarded routes with steps on one store, each with its own completer.
describe.each([memory, sqlite, postgres, mysql, redis])(
  'one route’s completer and another route’s operations ($name)',
  (factory) => {
    it.skipIf(factory.available === false)(
      'a completer re-drives only the operations of its own route; the other route finishes its own',
      async () => {
        const { store, cleanup } = await factory.open();
        const ran: string[] = [];
        let providerDown = true;
        const route = (name: string, answer: string) =>
          idempotency({ store, lease: 200, route: `POST /${name}` })(async (_req, res, idem) => {
            if (!idem) return void res.writeHead(400).end();
            await idem.step('recorded', () => name);
            const done = await idem.step(answer, () => {
              if (providerDown) throw new Error('provider down');
              ran.push(name);
              return `${answer}_1`;
            });
            res
              .writeHead(201, { 'content-type': 'application/json' })
              .end(JSON.stringify({ [answer]: done }));
          });
        const charges = route('charges', 'charged');
        const refunds = route('refunds', 'refunded');
        const server = http.createServer((req, res) =>
          (req.url === '/charges' ? charges : refunds)(req, res),
        );
        server.listen(0, '127.0.0.1');
        await once(server, 'listening');
        try {
          const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
          const key = randomUUID();
          const refund = () =>
            fetch(`${base}/refunds`, {
              method: 'POST',
              headers: { 'content-type': 'application/json', 'idempotency-key': key },
              body: '{"amount":40}',
            });
          expect((await refund()).status).toBe(500);
          providerDown = false;
          await sleep(5);
          const outcomes: unknown[] = [];
          const pass = (guarded: typeof charges) =>
            resumeAbandoned({
              store,
              resume: async (record, signal) => outcomes.push(await guarded.resume(record, signal)),
            });
          expect(await pass(charges)).toBe(1);
          expect(outcomes).toEqual([undefined]);
          expect(ran).toEqual([]);
          expect((await store.get('', key))?.state).toBe('in_progress');
          await pass(refunds);
          expect(ran).toEqual(['refunds']);
          const late = await refund();
          expect(late.headers.get('idempotency-replayed')).toBe('true');
          expect(await late.json()).toEqual({ refunded: 'refunded_1' });
        } finally {
          await new Promise<void>((resolve) => server.close(() => resolve()));
          await store.close();
          await cleanup?.();
        }
      },
    );
  },
);

/** `store` whose claims wait while `hold()` holds them (a locked row), and which notes what follows. */
function heldClaims(store: IdempotencyStore) {
  let held: Promise<void> | undefined;
  let letGoOf = () => {};
  const after: Promise<unknown>[] = [];
  const proxy = new Proxy(store, {
    get(target, name) {
      const value = Reflect.get(target, name, target);
      if (typeof value !== 'function') return value;
      const call = (value as (...args: unknown[]) => Promise<unknown>).bind(target);
      if (name === 'claim') {
        return async (...args: unknown[]) => {
          if (held) await held;
          return call(...args);
        };
      }
      if (name === 'release' || name === 'renew') {
        return (...args: unknown[]) => {
          const answer = call(...args);
          after.push(answer);
          return answer;
        };
      }
      return call;
    },
  });
  return {
    store: proxy,
    hold() {
      held = new Promise((resolve) => (letGoOf = resolve));
      after.length = 0;
    },
    /** Lets the held claim land and resolves once what the engine did after it has answered. */
    async letGo() {
      held = undefined;
      letGoOf();
      for (let tries = 0; tries < 200 && after.length === 0; tries++) await sleep(25);
      await Promise.all(after);
    },
  };
}

// Issue 32, item 1: a claim that lands after its request was answered 503 (store timeout).
describe.each([memory, sqlite, postgres, mysql, redis])(
  'a late claim and the finished steps ($name)',
  (factory) => {
    it.skipIf(factory.available === false)(
      'a takeover claim landing after the 503 keeps the finished steps: the next retry does not run them again',
      async () => {
        const { store: base, cleanup } = await factory.open();
        const claims = heldClaims(base);
        let charges = 0;
        let providerDown = true;
        const guarded = idempotency({ store: claims.store, lease: 300, storeTimeout: 300 })(
          async (_req, res, idem) => {
            if (!idem) return void res.writeHead(400).end();
            const charge = await idem.step('charged', () => `ch_${++charges}`);
            if (providerDown) throw new Error('the next provider is down');
            res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ charge }));
          },
        );
        const server = http.createServer(guarded).listen(0, '127.0.0.1');
        await once(server, 'listening');
        try {
          const at = `http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`;
          const key = randomUUID();
          const send = () =>
            fetch(at, {
              method: 'POST',
              headers: { 'content-type': 'application/json', 'idempotency-key': key },
              body: '{"amount":40}',
            });
          expect((await send()).status).toBe(500);
          claims.hold();
          const timedOut = await send();
          expect([timedOut.status, (await timedOut.json()).error]).toEqual([503, 'store_unavailable']);
          await claims.letGo();
          providerDown = false;
          expect((await base.get('', key))?.steps).toEqual(['charged']);
          let answer = await send();
          for (let tries = 0; tries < 100 && answer.status === 409; tries++) {
            await sleep(50);
            answer = await send();
          }
          expect(answer.status).toBe(201);
          expect(await answer.json()).toEqual({ charge: 'ch_1' });
          expect(charges).toBe(1);
        } finally {
          await new Promise<void>((resolve) => server.close(() => resolve()));
          await base.close();
          await cleanup?.();
        }
      },
    );
  },
);
