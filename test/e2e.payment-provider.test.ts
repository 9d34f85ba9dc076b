import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, tempDatabaseUrl } from './support/loan-desk.js';

/**
 * `npm run provider` (examples/payment-provider): the toy payment provider the loan desk charges
 * fines at. It must behave like a real one on retries: the same `Idempotency-Key` is one charge.
 */

let baseUrl: string;
let stop: () => Promise<void>;

beforeAll(async () => {
  const child = spawn(process.execPath, ['examples/payment-provider/server.js'], {
    cwd: ROOT,
    env: { ...process.env, PROVIDER_PORT: '0', PROVIDER_DB: tempDatabaseUrl('provider'), HOST: '127.0.0.1' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let output = '';
  baseUrl = await new Promise<string>((resolve, reject) => {
    child.stdout!.setEncoding('utf8').on('data', (text: string) => {
      output += text;
      const match = /payment provider listening on (http:\/\/\S+)/.exec(output);
      if (match) resolve(match[1]!);
    });
    child.once('exit', (code) => reject(new Error(`provider exited (${code}): ${output}`)));
  });
  stop = () =>
    new Promise((resolve) => {
      child.once('exit', () => resolve());
      child.kill('SIGTERM');
    });
});
afterAll(() => stop());

const charge = (body: unknown, key?: string) =>
  fetch(`${baseUrl}/charges`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });

const charges = async (): Promise<Array<Record<string, unknown>>> =>
  (await fetch(`${baseUrl}/charges`)).json();

describe('payment provider', () => {
  it('POST /charges answers 201 with the charge; a retry with the same key replays it, one charge', async () => {
    const body = { amount: 250, currency: 'eur', reference: 'fine-replay' };
    const first = await charge(body, 'charge-key-1');
    expect(first.status).toBe(201);
    const made = await first.json();
    expect(made).toEqual({ id: expect.stringMatching(/^ch_[0-9a-f]{24}$/), ...body });

    const retry = await charge(body, 'charge-key-1');
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotency-replayed')).toBe('true');
    expect(await retry.json()).toEqual(made);
    expect((await charges()).filter((c) => c.reference === 'fine-replay')).toEqual([made]);
  });

  it('the same key with another body is refused (409), and nothing more is charged', async () => {
    await charge({ amount: 100, currency: 'eur', reference: 'fine-mismatch' }, 'charge-key-2');
    const other = await charge({ amount: 999, currency: 'eur', reference: 'fine-mismatch' }, 'charge-key-2');
    expect(other.status).toBe(409);
    expect((await charges()).filter((c) => c.reference === 'fine-mismatch')).toHaveLength(1);
  });

  it('without a key every POST is a new charge', async () => {
    const body = { amount: 5, currency: 'usd', reference: 'fine-keyless' };
    expect((await charge(body)).status).toBe(201);
    expect((await charge(body)).status).toBe(201);
    expect((await charges()).filter((c) => c.reference === 'fine-keyless')).toHaveLength(2);
  });

  it.each([
    ['not JSON', '{"amount":', 'invalid_json', undefined],
    ['an array', [], 'invalid_body', undefined],
    ['amount 0', { amount: 0, currency: 'eur', reference: 'r' }, 'validation', 'amount'],
    ['amount 1.5', { amount: 1.5, currency: 'eur', reference: 'r' }, 'validation', 'amount'],
    ['amount as text', { amount: '10', currency: 'eur', reference: 'r' }, 'validation', 'amount'],
    ['currency EURO', { amount: 10, currency: 'EURO', reference: 'r' }, 'validation', 'currency'],
    ['an empty reference', { amount: 10, currency: 'eur', reference: '' }, 'validation', 'reference'],
    ['no reference', { amount: 10, currency: 'eur' }, 'validation', 'reference'],
  ])('%s: 400 JSON naming the problem, nothing charged', async (name, body, error, field) => {
    const before = (await charges()).length;
    const response = await charge(body, `bad-${name.replaceAll(' ', '-')}`);
    expect(response.status).toBe(400);
    expect(response.headers.get('content-type')).toMatch(/^application\/json/);
    const answer = await response.json();
    expect(answer.error).toBe(error);
    expect(answer.field).toBe(field);
    expect(await charges()).toHaveLength(before);
  });

  it('an unknown path is 404 and another method 405, both JSON', async () => {
    const missing = await fetch(`${baseUrl}/refunds`);
    expect(missing.status).toBe(404);
    expect(await missing.json()).toEqual({ error: 'path_not_found' });
    const wrong = await fetch(`${baseUrl}/charges`, { method: 'DELETE' });
    expect(wrong.status).toBe(405);
    expect(wrong.headers.get('allow')).toBe('GET, POST');
  });
});
