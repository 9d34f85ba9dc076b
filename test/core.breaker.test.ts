import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/node.js';
import {
  ConfigError,
  type IdempotencyEvent,
  idempotent,
  isIdempotencyError,
  storeCircuit,
} from '../src/core/index.js';
import type { IdempotencyStore } from '../src/core/store.js';
import { memoryStore } from '../src/stores/memory.js';

/** A memory store whose calls fail (throw, or hang past `storeTimeout`) while `down` says so, counted. */
function switchableStore(failure: 'throw' | 'hang' = 'throw') {
  const inner = memoryStore();
  const state = { down: false, calls: 0 };
  const store = new Proxy(inner, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (typeof value !== 'function' || property === 'close' || property === 'name') return value;
      return (...args: unknown[]) => {
        state.calls++;
        if (!state.down) return value.apply(target, args);
        return failure === 'throw' ? Promise.reject(new Error('connection refused')) : new Promise(() => {});
      };
    },
  }) as IdempotencyStore;
  return { store, state };
}

const servers: http.Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((server) => new Promise((done) => server.close(done))));
});

async function serve(options: Parameters<typeof idempotency>[0]) {
  let runs = 0;
  const server = http.createServer(
    idempotency(options)((_req, res) => {
      runs++;
      res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ run: runs }));
    }),
  );
  servers.push(server);
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const { port } = server.address() as AddressInfo;
  const post = async (key: string) => {
    const response = await fetch(`http://127.0.0.1:${port}/orders`, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      body: '{}',
    });
    return {
      status: response.status,
      retryAfter: response.headers.get('retry-after'),
      body: await response.json(),
    };
  };
  return { post, runs: () => runs };
}

describe('circuit breaker in front of the store', () => {
  it('opens after `failures` failed calls in a row: later requests get 503 at once, without a store call', async () => {
    const { store, state } = switchableStore();
    const events: IdempotencyEvent[] = [];
    const app = await serve({
      store,
      circuitBreaker: { failures: 3, cooldown: '1h' },
      onEvent: (event) => events.push(event),
    });
    state.down = true;
    for (let i = 0; i < 3; i++) expect((await app.post(`k${i}`)).status).toBe(503);
    expect(state.calls).toBe(3);
    expect(events.filter((e) => e.type === 'circuit')).toEqual([
      { type: 'circuit', state: 'open', store: 'memory', failures: 3 },
    ]);
    expect(storeCircuit(store)).toEqual({ state: 'open', failures: 3 });

    // The store is back, but the circuit stays open for its cooldown: refused without asking it.
    state.down = false;
    const refused = await app.post('k-later');
    expect(refused.status).toBe(503);
    expect(refused.body.error).toBe('store_unavailable');
    expect(Number(refused.retryAfter)).toBeGreaterThan(3000);
    expect(state.calls).toBe(3);
    expect(app.runs()).toBe(0);
    expect(events.at(-1)).toEqual({ type: 'rejected', reason: 'circuit_open', key: 'k-later', scope: '' });
  });

  it('does not open on failures that are not in a row', async () => {
    const { store, state } = switchableStore();
    const app = await serve({ store, circuitBreaker: { failures: 2, cooldown: '1h' } });
    for (let i = 0; i < 4; i++) {
      state.down = true;
      expect((await app.post(`down${i}`)).status).toBe(503);
      state.down = false;
      expect((await app.post(`up${i}`)).status).toBe(201);
    }
    expect(storeCircuit(store).state).toBe('closed');
  });

  it('after the cooldown one request probes the store; its success closes the circuit', async () => {
    const { store, state } = switchableStore();
    const events: IdempotencyEvent[] = [];
    const app = await serve({
      store,
      circuitBreaker: { failures: 2, cooldown: '50ms' },
      onEvent: (event) => events.push(event),
    });
    state.down = true;
    await app.post('a');
    await app.post('b');
    expect(storeCircuit(store).state).toBe('open');
    // A probe while the store is still down opens it again for another cooldown.
    await sleep(60);
    const callsBefore = state.calls;
    expect((await app.post('probe-1')).status).toBe(503);
    expect(state.calls).toBe(callsBefore + 1);
    expect(storeCircuit(store).state).toBe('open');
    expect((await app.post('refused')).status).toBe(503);
    expect(state.calls).toBe(callsBefore + 1);

    state.down = false;
    await sleep(60);
    const probe = await app.post('probe-2');
    expect(probe.status).toBe(201);
    expect(storeCircuit(store)).toEqual({ state: 'closed', failures: 0 });
    expect((await app.post('after')).status).toBe(201);
    expect(events.filter((e) => e.type === 'circuit').map((e) => e.type === 'circuit' && e.state)).toEqual([
      'open',
      'closed',
    ]);
  });

  it('spares requests the store timeout once open: a hung store is asked `failures` times, not once per request', async () => {
    const { store, state } = switchableStore('hang');
    const app = await serve({ store, storeTimeout: '20ms', circuitBreaker: { failures: 2, cooldown: '1h' } });
    state.down = true;
    await Promise.all([app.post('h1'), app.post('h2')]);
    const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => app.post(`pile-${i}`)));
    expect(answers.every((answer) => answer.status === 503)).toBe(true);
    // Two timed-out claims opened it; the 20 requests after never reached the store.
    expect(state.calls).toBe(2);
  });

  it('is shared by every route and job on one store, and is off with `circuitBreaker: false`', async () => {
    const { store, state } = switchableStore();
    const settings = { failures: 2, cooldown: '1h' } as const;
    const route = await serve({ store, circuitBreaker: settings });
    const job = idempotent({ store, circuitBreaker: settings, key: (id: string) => id });
    state.down = true;
    await route.post('r1');
    await route.post('r2');
    state.down = false;
    const refusal = await job('j1', async () => 'ran').catch((error: unknown) => error);
    expect(isIdempotencyError(refusal) && refusal.code).toBe('store_unavailable');

    const unguarded = await serve({ store, circuitBreaker: false });
    expect((await unguarded.post('free')).status).toBe(201);
  });

  it('refuses settings it does not know', () => {
    const { store } = switchableStore();
    expect(() => idempotency({ store, circuitBreaker: { failures: 0 } })).toThrow(ConfigError);
    expect(() => idempotency({ store, circuitBreaker: { cooldown: 'soon' as never } })).toThrow(ConfigError);
    expect(() => idempotency({ store, circuitBreaker: { threshold: 3 } as never })).toThrow(
      /knows `failures`/,
    );
    expect(() => idempotency({ store, circuitBreaker: true as never })).toThrow(ConfigError);
  });

  it('is on by default: 5 failures in a row, 1 s', async () => {
    const { store, state } = switchableStore();
    const app = await serve({ store });
    state.down = true;
    for (let i = 0; i < 5; i++) await app.post(`d${i}`);
    state.down = false;
    const refused = await app.post('d-after');
    expect(refused.status).toBe(503);
    expect(refused.retryAfter).toBe('1');
    expect(state.calls).toBe(5);
  });
});
