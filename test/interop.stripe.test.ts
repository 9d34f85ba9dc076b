/**
 * A Stripe-shaped API behind retrysafe, driven by the real stripe-node client: the recipe of
 * docs/reference.md ("Stripe-compatible APIs") makes stripe-node see a reused key as its own
 * `StripeIdempotencyError` at once, where the default 409 makes it retry the mismatch.
 */
import type { AddressInfo } from 'node:net';
import express, { type Request } from 'express';
import Stripe from 'stripe';
import { afterEach, describe, expect, it } from 'vitest';
import type { ExpressIdempotencyOptions } from '../src/adapters/express.js';
import { idempotency } from '../src/adapters/express.js';
import type { IdempotencyError } from '../src/core/contract/index.js';
import { memoryStore } from '../src/stores/memory.js';

// The recipe, as docs/reference.md shows it.
const STRIPE_ERRORS: Record<string, { status: number; type: string; retry: boolean }> = {
  key_conflict: { status: 400, type: 'idempotency_error', retry: false },
  request_in_progress: { status: 409, type: 'idempotency_error', retry: true },
  store_unavailable: { status: 503, type: 'api_error', retry: true },
};

function stripeShaped(error: IdempotencyError) {
  const shape = STRIPE_ERRORS[error.code] ?? {
    status: error.status,
    type: 'invalid_request_error',
    retry: false,
  };
  const body = { error: { type: shape.type, code: error.code, message: error.message } };
  return {
    status: shape.status,
    headers: {
      ...error.headers,
      'content-type': 'application/json',
      'stripe-should-retry': String(shape.retry),
      ...(error.key === undefined ? {} : { 'idempotency-key': error.key }),
    },
    body: Buffer.from(JSON.stringify(body)),
  };
}

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

/** `POST /v1/customers` guarded by retrysafe; counts the attempts that reach the server. */
async function customersApi(options: Partial<ExpressIdempotencyOptions<Request>>) {
  const seen = { attempts: 0, created: 0 };
  const store = memoryStore();
  const app = express();
  app.use((_req, _res, next) => {
    seen.attempts += 1;
    next();
  });
  app.use(express.urlencoded({ extended: true }));
  app.post('/v1/customers', idempotency({ store, ...options }), (req, res) => {
    seen.created += 1;
    const key = req.idempotency?.key;
    if (key) res.set('Idempotency-Key', key);
    res.json({ id: `cus_${seen.created}`, object: 'customer', email: req.body.email });
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  closers.push(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await store.close();
  });
  const stripe = new Stripe('sk_test_retrysafe', {
    host: '127.0.0.1',
    port: (server.address() as AddressInfo).port,
    protocol: 'http',
    maxNetworkRetries: 2,
    telemetry: false,
  });
  return { stripe, seen };
}

describe('stripe-node against a Stripe-shaped API', () => {
  it('replays a retried create with Idempotent-Replayed and the key echoed', async () => {
    const { stripe, seen } = await customersApi({
      replayedHeader: 'Idempotent-Replayed',
      replayHeaders: ['idempotency-key'],
      onError: stripeShaped,
    });
    const first = await stripe.customers.create({ email: 'ada@example.org' }, { idempotencyKey: 'cus-ada' });
    const again = await stripe.customers.create({ email: 'ada@example.org' }, { idempotencyKey: 'cus-ada' });
    expect(again.id).toBe(first.id);
    expect(seen.created).toBe(1);
    expect(again.lastResponse.headers['idempotent-replayed']).toBe('true');
    expect(again.lastResponse.headers['idempotency-replayed']).toBeUndefined();
    expect(again.lastResponse.idempotencyKey).toBe('cus-ada');
  });

  it('by default a reused key is a 409 that stripe-node retries to no purpose', async () => {
    const { stripe, seen } = await customersApi({});
    await stripe.customers.create({ email: 'ada@example.org' }, { idempotencyKey: 'cus-ada' });
    const reused = stripe.customers.create({ email: 'bob@example.org' }, { idempotencyKey: 'cus-ada' });
    await expect(reused).rejects.toMatchObject({ statusCode: 409 });
    expect(seen.attempts).toBe(1 + 3);
  });

  it('with the recipe a reused key raises StripeIdempotencyError at once, not retried', async () => {
    const { stripe, seen } = await customersApi({ onError: stripeShaped });
    await stripe.customers.create({ email: 'ada@example.org' }, { idempotencyKey: 'cus-ada' });
    const reused = stripe.customers.create({ email: 'bob@example.org' }, { idempotencyKey: 'cus-ada' });
    await expect(reused).rejects.toBeInstanceOf(Stripe.errors.StripeIdempotencyError);
    await expect(reused).rejects.toMatchObject({ statusCode: 400, code: 'key_conflict' });
    expect(seen.attempts).toBe(1 + 1);
    expect(seen.created).toBe(1);
  });
});
