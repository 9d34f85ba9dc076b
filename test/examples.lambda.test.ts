import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Dynalite, lambdaExampleEnv, startDynalite } from './support/dynalite.js';

/**
 * examples/lambda/handler.js as Lambda runs it: each execution environment (a worker thread here)
 * loads the module once and serves invocations; API Gateway's HTTP API payload 2.0 events.
 */
const ENVIRONMENTS = 4;
const INVOCATIONS_EACH = 5;

interface Result {
  statusCode: number;
  headers: Record<string, string>;
  body: string;
}

function event(method: string, headers: Record<string, string> = {}, body?: unknown) {
  return {
    version: '2.0',
    routeKey: `${method} /orders`,
    rawPath: '/orders',
    headers,
    requestContext: { http: { method, path: '/orders' } },
    isBase64Encoded: false,
    ...(body !== undefined && { body: typeof body === 'string' ? body : JSON.stringify(body) }),
  };
}

describe('examples/lambda: idempotent() around a Lambda handler, keys in DynamoDB (dynalite)', () => {
  let server: Dynalite;
  const environments: Worker[] = [];

  /** Orders written by every environment's handler so far. */
  const written: number[] = Array(ENVIRONMENTS).fill(0);
  const ordersWritten = () => written.reduce((sum, count) => sum + count, 0);

  /** Sends each environment its events, all at once, and gathers every answer. */
  async function invoke(perEnvironment: ReturnType<typeof event>[][]): Promise<Result[]> {
    const answers = perEnvironment.map(async (events, i) => {
      const worker = environments[i]!;
      const answered = once(worker, 'message');
      worker.postMessage(events);
      const [{ results, ordersWritten }] = (await answered) as [{ results: Result[]; ordersWritten: number }];
      written[i] = ordersWritten;
      return results;
    });
    return (await Promise.all(answers)).flat();
  }

  const orders = async () => JSON.parse((await invoke([[event('GET')]]))[0]!.body) as unknown[];

  beforeAll(async () => {
    server = await startDynalite();
    const env = { ...process.env, ...(await lambdaExampleEnv(server)) };
    const handler = pathToFileURL(join(import.meta.dirname, '../examples/lambda/handler.js')).href;
    for (let i = 0; i < ENVIRONMENTS; i++) {
      const worker = new Worker(join(import.meta.dirname, 'support/lambda-environment.mjs'), {
        workerData: { handler },
        env,
      });
      environments.push(worker);
      const [ready] = await once(worker, 'message');
      expect(ready).toBe('ready');
    }
  });

  afterAll(async () => {
    await Promise.all(environments.map((worker) => worker.terminate()));
    await server?.close();
  });

  it('concurrent duplicate invocations in several environments make one order, and all answer it', async () => {
    const key = randomUUID();
    const duplicate = event('POST', { 'idempotency-key': key }, { item: 'book' });
    const results = await invoke(
      Array.from({ length: ENVIRONMENTS }, () => Array(INVOCATIONS_EACH).fill(duplicate)),
    );
    expect(results).toHaveLength(ENVIRONMENTS * INVOCATIONS_EACH);
    expect(new Set(results.map((result) => result.statusCode))).toEqual(new Set([201]));
    expect(new Set(results.map((result) => result.body)).size).toBe(1);
    const order = JSON.parse(results[0]!.body) as { id: string; item: string };
    expect(order.item).toBe('book');
    expect(results[0]!.headers.location).toBe(`/orders/${order.id}`);
    expect(await orders()).toEqual([order]);
    // Run once: the other 19 waited for its answer or replayed it, in whichever environment.
    expect(ordersWritten()).toBe(1);

    // Later, from any environment: the same order again, nothing new.
    const [later] = await invoke([[], [], [duplicate]]);
    expect(later).toMatchObject({ statusCode: 201, body: results[0]!.body });
    expect(await orders()).toHaveLength(1);
    expect(ordersWritten()).toBe(1);
  });

  it('another item under the same key is 409 key_conflict and makes nothing', async () => {
    const key = randomUUID();
    const before = (await orders()).length;
    const [first] = await invoke([[event('POST', { 'idempotency-key': key }, { item: 'pen' })]]);
    expect(first!.statusCode).toBe(201);
    const [conflict] = await invoke([[], [event('POST', { 'idempotency-key': key }, { item: 'ink' })]]);
    expect(conflict!.statusCode).toBe(409);
    expect(JSON.parse(conflict!.body)).toMatchObject({ error: 'key_conflict' });
    expect(await orders()).toHaveLength(before + 1);
  });

  it('a request without a key, or with a bad body, is 400 and makes nothing', async () => {
    const before = (await orders()).length;
    const answers = await invoke([
      [
        event('POST', {}, { item: 'book' }),
        event('POST', { 'idempotency-key': randomUUID() }, 'not json'),
        event('POST', { 'idempotency-key': randomUUID() }, { item: 7 }),
      ],
    ]);
    expect(answers.map((answer) => [answer.statusCode, JSON.parse(answer.body).error])).toEqual([
      [400, 'idempotency_key_missing'],
      [400, 'body_invalid'],
      [400, 'body_invalid'],
    ]);
    expect(await orders()).toHaveLength(before);
  });
});
