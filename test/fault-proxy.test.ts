import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, beforeEach, expect, it } from 'vitest';
import {
  createFaultProxy,
  type FaultProxy,
  type FaultProxyOptions,
} from '../examples/library-loans/faults/fault-proxy.js';

let received: string[] = [];
/** The `x-lose` header of each request the target saw. */
let marks: Array<string | undefined> = [];
let targetPort = 0;
const target = http.createServer((req, res) => {
  marks.push(req.headers['x-lose'] as string | undefined);
  const chunks: Buffer[] = [];
  req.on('data', (chunk: Buffer) => chunks.push(chunk));
  req.on('end', () => {
    received.push(Buffer.concat(chunks).toString());
    res.writeHead(201, { 'content-type': 'application/json', 'x-target': 'yes' });
    res.end(JSON.stringify({ n: received.length }));
  });
});

beforeAll(async () => {
  await new Promise<void>((resolve) => target.listen(0, '127.0.0.1', resolve));
  targetPort = (target.address() as AddressInfo).port;
});
afterAll(async () => {
  target.closeAllConnections();
  await new Promise((resolve) => target.close(resolve));
});

let proxies: FaultProxy[] = [];
beforeEach(() => {
  received = [];
  marks = [];
});
afterEach(async () => {
  await Promise.all(proxies.map((proxy) => proxy.close()));
  proxies = [];
});

async function startProxy(options: Omit<FaultProxyOptions, 'targetPort'>) {
  const proxy = createFaultProxy({ targetPort, ...options });
  proxies.push(proxy);
  const port = await proxy.start();
  const send = (body: string, headers: Record<string, string> = {}) =>
    fetch(`http://127.0.0.1:${port}/loans`, { method: 'POST', body, headers });
  return { proxy, send };
}

it('passes requests through and counts them', async () => {
  const { proxy, send } = await startProxy({});
  for (let i = 0; i < 5; i++) {
    const response = await send(`body-${i}`);
    expect(response.status).toBe(201);
    expect(response.headers.get('x-target')).toBe('yes');
    expect(response.headers.get('connection')).toBe('close');
    expect(await response.json()).toEqual({ n: i + 1 });
  }
  expect(received).toEqual(['body-0', 'body-1', 'body-2', 'body-3', 'body-4']);
  expect(proxy.stats).toMatchObject({
    connections: 5,
    requests: 5,
    forwarded: 5,
    passed: 5,
    refused: 0,
    dropped: 0,
  });
});

it('refuses a connection before the target sees anything', async () => {
  const { proxy, send } = await startProxy({ refuseRate: 1 });
  await expect(send('never')).rejects.toThrow(TypeError);
  expect(received).toEqual([]);
  expect(proxy.stats).toMatchObject({ connections: 1, refused: 1, requests: 0, forwarded: 0 });
});

it('drops the response only after the target processed the request', async () => {
  const { proxy, send } = await startProxy({ dropRate: 1 });
  await expect(send('processed')).rejects.toThrow(TypeError);
  expect(received).toEqual(['processed']);
  expect(proxy.stats).toMatchObject({ requests: 1, forwarded: 1, dropped: 1, passed: 0 });
});

it('drops the response of a request carrying `dropHeader`, forwarded without it, and relays the rest', async () => {
  const { proxy, send } = await startProxy({ dropHeader: 'x-lose' });
  await expect(send('marked', { 'x-lose': '1' })).rejects.toThrow(TypeError);
  expect((await send('plain')).status).toBe(201);
  expect(received).toEqual(['marked', 'plain']);
  expect(marks).toEqual([undefined, undefined]);
  expect(proxy.stats).toMatchObject({ requests: 2, forwarded: 2, dropped: 1, passed: 1 });
});

it('delays a response and still relays it intact', async () => {
  const { proxy, send } = await startProxy({ delayRate: 1, delayMs: 50 });
  const response = await send('late');
  expect(response.status).toBe(201);
  expect(await response.json()).toEqual({ n: 1 });
  expect(proxy.stats).toMatchObject({ forwarded: 1, delayed: 1, passed: 0, dropped: 0 });
});

it('answers 502 when the target is unreachable', async () => {
  const proxy = createFaultProxy({ targetPort: 1 });
  proxies.push(proxy);
  const port = await proxy.start();
  const response = await fetch(`http://127.0.0.1:${port}/`);
  expect(response.status).toBe(502);
  expect(proxy.stats.upstreamErrors).toBe(1);
});

it('counters add up under mixed faults, and a seed reproduces the same faults', async () => {
  const run = async () => {
    const { proxy, send } = await startProxy({
      seed: 42,
      refuseRate: 0.2,
      dropRate: 0.3,
      delayRate: 0.2,
      delayMs: 5,
    });
    const outcomes: string[] = [];
    for (let i = 0; i < 40; i++) {
      outcomes.push(
        await send(`r${i}`).then(
          (r) => String(r.status),
          () => 'failed',
        ),
      );
    }
    return { outcomes, stats: { ...proxy.stats } };
  };
  const first = await run();
  const targetSaw = received.length;
  const second = await run();
  expect(second).toEqual(first);

  const { stats } = first;
  expect(stats.connections).toBe(40);
  expect(stats.refused + stats.requests).toBe(40);
  expect(stats.forwarded).toBe(stats.requests);
  expect(stats.dropped + stats.delayed + stats.passed).toBe(stats.forwarded);
  expect(targetSaw).toBe(stats.forwarded);
  expect(first.outcomes.filter((o) => o === 'failed')).toHaveLength(stats.refused + stats.dropped);
  for (const name of ['refused', 'dropped', 'delayed', 'passed'] as const)
    expect(stats[name]).toBeGreaterThan(0);
});

it('rejects impossible rates', () => {
  expect(() => createFaultProxy({ targetPort, dropRate: 1.5 })).toThrow(/dropRate/);
  expect(() => createFaultProxy({ targetPort, dropRate: 0.6, delayRate: 0.6 })).toThrow(
    /dropRate \+ delayRate/,
  );
});
