import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readConfig } from '../examples/library-loans/config.js';
import {
  chargesFor,
  expectChargedOnce,
  FINE_DATABASES,
  firstFinePaid,
  listFines,
  type Provider,
  postFine,
  startPaymentProvider,
} from './support/fines.js';
import { freePort } from './support/free-port.js';
import { describeEachDatabase, type LoanDesk, startLoanDesk } from './support/loan-desk.js';

/**
 * `POST /fines` of the loan desk: the fine is recorded, charged at examples/payment-provider and
 * marked paid, under a required `Idempotency-Key`. The crash and completer cases are in
 * e2e.loan-desk-fines-crash.test.ts.
 */

describeEachDatabase('fines on $name', FINE_DATABASES, (database) => {
  let provider: Provider;
  let desk: LoanDesk;
  beforeAll(async () => {
    provider = await startPaymentProvider();
    desk = await startLoanDesk({
      env: { ...database.env(), PROVIDER_URL: provider.url, COMPLETER: '0' },
    });
  });
  afterAll(async () => {
    expect(await desk?.stop()).toBe(0);
    await provider?.close();
    await database.cleanup();
  });

  it('POST /fines answers 201 paid with the charge; a retry replays it; one fine, one charge', async () => {
    const first = await postFine(desk.baseUrl, { member: 'U-1001', amount: 350 }, 'fine-1');
    expect(first.status).toBe(201);
    expect(first.body).toEqual({
      id: expect.any(Number),
      member: 'U-1001',
      amount: 350,
      status: 'paid',
      chargeId: expect.stringMatching(/^ch_/),
    });
    expect(first.headers.get('location')).toBe(`/fines/${first.body.id}`);

    const retry = await postFine(desk.baseUrl, { member: 'U-1001', amount: 350 }, 'fine-1');
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotency-replayed')).toBe('true');
    expect(retry.text).toBe(first.text);

    await expectChargedOnce(provider, first.body);
    expect((await listFines(desk.baseUrl)).filter((fine) => fine.id === first.body.id)).toEqual([first.body]);
  });

  it('GET /fines/:id and GET /fines?member= show the fines', async () => {
    const a = await postFine(desk.baseUrl, { member: 'U-1002', amount: 100 }, 'fine-list-a');
    const b = await postFine(desk.baseUrl, { member: 'U-1002', amount: 200 }, 'fine-list-b');
    await postFine(desk.baseUrl, { member: 'U-1003', amount: 300 }, 'fine-list-c');
    const one = await fetch(`${desk.baseUrl}/fines/${a.body.id}`);
    expect(one.status).toBe(200);
    expect(await one.json()).toEqual(a.body);
    const ofMember = await fetch(`${desk.baseUrl}/fines?member=U-1002`);
    expect(await ofMember.json()).toEqual([a.body, b.body]);
    expect(await (await fetch(`${desk.baseUrl}/fines?member=U-9999`)).json()).toEqual([]);
    for (const path of ['/fines/999999', '/fines/abc']) {
      const missing = await fetch(`${desk.baseUrl}${path}`);
      expect(missing.status).toBe(404);
      expect(await missing.json()).toEqual({ error: 'fine_not_found' });
    }
  });

  it('a fine needs a key: without one it is 400 and nothing is recorded or charged', async () => {
    const before = (await listFines(desk.baseUrl)).length;
    const answer = await postFine(desk.baseUrl, { member: 'U-1004', amount: 100 }, null);
    expect(answer.status).toBe(400);
    expect(answer.body.error).toMatch(/key/);
    expect(await listFines(desk.baseUrl)).toHaveLength(before);
  });

  it.each([
    ['amount 0', { member: 'U-1004', amount: 0 }, 'amount'],
    ['amount 2.5', { member: 'U-1004', amount: 2.5 }, 'amount'],
    ['amount as text', { member: 'U-1004', amount: '5' }, 'amount'],
    ['a member not a string', { member: 7, amount: 5 }, 'member'],
  ])('%s: 400 naming the field, nothing recorded', async (name, body, field) => {
    const before = (await listFines(desk.baseUrl)).length;
    const answer = await postFine(desk.baseUrl, body, `bad-${name.replaceAll(' ', '-')}`);
    expect(answer.status).toBe(400);
    expect(answer.body).toMatchObject({ error: 'validation', field });
    expect(await listFines(desk.baseUrl)).toHaveLength(before);
  });

  it('an unknown member is 422 like a loan; the key stays free for the corrected fine', async () => {
    const before = (await listFines(desk.baseUrl)).length;
    const unknown = await postFine(desk.baseUrl, { member: 'U-9999', amount: 100 }, 'fine-unknown');
    expect(unknown.status).toBe(422);
    expect(unknown.body).toMatchObject({ error: 'validation', field: 'member' });
    expect(await listFines(desk.baseUrl)).toHaveLength(before);
    // Not saved: the same key with the corrected body is a new fine, not a conflict.
    const fixed = await postFine(desk.baseUrl, { member: 'U-1005', amount: 100 }, 'fine-unknown');
    expect(fixed.status).toBe(201);
  });

  it('without DEMO_FAULTS=1 the Demo-Crash-After header is ignored', async () => {
    const answer = await postFine(desk.baseUrl, { member: 'U-1009', amount: 10 }, 'fine-no-crash', {
      'demo-crash-after': 'recorded',
    });
    expect(answer.status).toBe(201);
    expect((await fetch(`${desk.baseUrl}/fines/${answer.body.id}`)).status).toBe(200);
  });

  it('a body that is not JSON is 400, one not declared JSON 415', async () => {
    expect((await postFine(desk.baseUrl, '{"member":', 'fine-bad-json')).body.error).toBe('invalid_json');
    const form = await fetch(`${desk.baseUrl}/fines`, {
      method: 'POST',
      headers: { 'content-type': 'text/plain', 'idempotency-key': 'fine-form' },
      body: '{"member":"U-1001","amount":5}',
    });
    expect(form.status).toBe(415);
  });
});

/** A server on `port` answering every request with `status`, until closed. */
async function answering(port: number, status: number): Promise<http.Server> {
  const server = http.createServer((_req, res) => res.writeHead(status).end('{"error":"down"}'));
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  return server;
}

const closeServer = (server: http.Server) =>
  new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });

describe('fines while the payment provider is down', () => {
  let desk: LoanDesk;
  let port: number;
  beforeAll(async () => {
    port = await freePort();
    desk = await startLoanDesk({ env: { PROVIDER_URL: `http://127.0.0.1:${port}`, COMPLETER: '0' } });
  });
  afterAll(async () => {
    expect(await desk?.stop()).toBe(0);
  });

  it('refused connections, then a 500: 503 with Retry-After each time; the retry once it is back pays once', async () => {
    const fine = { member: 'U-1006', amount: 700 };
    const refused = await postFine(desk.baseUrl, fine, 'fine-outage');
    expect(refused.status).toBe(503);
    expect(refused.headers.get('retry-after')).toBe('1');
    expect(refused.body.error).toBe('provider_unavailable');

    const failing = await answering(port, 500);
    const erring = await postFine(desk.baseUrl, fine, 'fine-outage');
    await closeServer(failing);
    expect(erring.status).toBe(503);
    expect(erring.headers.get('retry-after')).toBe('1');

    const provider = await startPaymentProvider(port);
    try {
      const paid = await postFine(desk.baseUrl, fine, 'fine-outage');
      expect(paid.status).toBe(201);
      expect(paid.body).toMatchObject({ ...fine, status: 'paid' });
      expect(await chargesFor(provider, paid.body.id)).toHaveLength(1);
      const fines = (await listFines(desk.baseUrl)).filter((one) => one.member === 'U-1006');
      expect(fines).toEqual([paid.body]);
      const again = await postFine(desk.baseUrl, fine, 'fine-outage');
      expect(again.text).toBe(paid.text);
      expect(await chargesFor(provider, paid.body.id)).toHaveLength(1);
    } finally {
      await provider.close();
    }
  });
});

describe('fines while the payment provider is down, the completer on', () => {
  it('the 503 fine is paid once the provider is back, with no retry; the late retry replays it', async () => {
    const port = await freePort();
    const desk = await startLoanDesk({
      env: { PROVIDER_URL: `http://127.0.0.1:${port}`, COMPLETER_INTERVAL: '250ms' },
    });
    try {
      const fine = { member: 'U-1008', amount: 900 };
      expect((await postFine(desk.baseUrl, fine, 'fine-outage-completer')).status).toBe(503);
      expect(await listFines(desk.baseUrl)).toEqual([expect.objectContaining({ status: 'pending' })]);
      const provider = await startPaymentProvider(port);
      try {
        const paid = await firstFinePaid(desk.baseUrl, 10_000);
        expect(await chargesFor(provider, paid.id)).toHaveLength(1);
        const late = await postFine(desk.baseUrl, fine, 'fine-outage-completer');
        expect(late.headers.get('idempotency-replayed')).toBe('true');
        expect(late.body).toEqual(paid);
      } finally {
        await provider.close();
      }
    } finally {
      expect(await desk.stop()).toBe(0);
    }
  });
});

describe('the fine settings', () => {
  it('default to the provider on 127.0.0.1:8484 and the completer on, every 5 s', () => {
    expect(readConfig({})).toMatchObject({
      providerUrl: 'http://127.0.0.1:8484',
      completer: true,
      completerIntervalMs: 5000,
    });
    expect(readConfig({ COMPLETER: '0', COMPLETER_INTERVAL: '250ms' })).toMatchObject({
      completer: false,
      completerIntervalMs: 250,
    });
  });

  it.each([
    ['PROVIDER_URL', 'ftp://127.0.0.1:8484'],
    ['PROVIDER_URL', 'not a url'],
    ['COMPLETER', 'yes'],
    ['COMPLETER_INTERVAL', 'soon'],
  ])('%s=%j stops the start naming the variable', (name, value) => {
    expect(() => readConfig({ [name]: value })).toThrow(new RegExp(`^${name}=`));
  });
});

describe("the desk's fine: which part is a phase", () => {
  it('charged (the provider call) is a step, never a phase, even with keys in the desk database', async () => {
    const { fineRoutes } = await import('../examples/library-loans/fines.js');
    const calls: string[] = [];
    const database = {
      memberExists: async () => true,
      recordFine: async (fine: { amount: number }) => ({ id: 1, amount: fine.amount }),
      markFinePaid: async (id: number, chargeId: string) => ({ id, status: 'paid', chargeId }),
    };
    let handler!: (req: unknown, res: unknown, idem: unknown) => Promise<void>;
    fineRoutes({
      database,
      guard: (fn: typeof handler) => (handler = fn),
      phases: true,
      providerUrl: 'http://127.0.0.1:1',
    });
    const idem = {
      fingerprint: 'f',
      downstreamKey: (purpose: string) => purpose,
      stepKey: (name: string) => name,
      // The provider is not called here: the charge's answer stands in for it.
      step: async (name: string, fn: () => unknown) => {
        calls.push(`step ${name}`);
        return name === 'charged' ? { id: 'ch_1' } : fn();
      },
      phase: async (name: string, fn: (tx: unknown) => unknown) => {
        calls.push(`phase ${name}`);
        return name === 'charged' ? { id: 'ch_1' } : fn({});
      },
    };
    let status = 0;
    const res = { writeHead: (code: number) => (status = code), end: () => undefined };
    await handler({ body: Buffer.from('{"member":"U-1","amount":5}'), headers: {} }, res, idem);
    expect(status).toBe(201);
    expect(calls).toEqual(['phase recorded', 'step charged', 'phase paid']);
  });
});
