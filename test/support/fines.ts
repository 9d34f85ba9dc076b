import { expect, vi } from 'vitest';
import { startProvider } from '../../examples/payment-provider/provider.js';
import { tempDatabaseUrl } from './loan-desk.js';
import {
  deleteRedisKeys,
  dropSchemas,
  hasPostgres,
  hasRedis,
  PG_URL,
  REDIS_URL,
  uniqueName,
} from './services.js';

export interface Provider {
  url: string;
  close(): Promise<void>;
}

/** examples/payment-provider in this process, on its own new SQLite file; `port` 0 picks a free one. */
export function startPaymentProvider(port = 0): Promise<Provider> {
  return startProvider({ host: '127.0.0.1', port, filename: tempDatabaseUrl('provider') });
}

/** The charges the provider made for `reference`. */
export async function chargesFor(provider: Provider, reference: string | number): Promise<unknown[]> {
  const charges: Array<{ reference: string }> = await (await fetch(`${provider.url}/charges`)).json();
  return charges.filter((charge) => charge.reference === String(reference));
}

export interface FineAnswer {
  status: number;
  headers: Headers;
  body: any;
  text: string;
}

/** `POST /fines` with a key (unless `null`) and extra headers; `body` a string is sent as it is. */
export async function postFine(
  baseUrl: string,
  body: unknown,
  key: string | null,
  headers: Record<string, string> = {},
): Promise<FineAnswer> {
  const response = await fetch(`${baseUrl}/fines`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(key === null ? {} : { 'idempotency-key': key }),
      ...headers,
    },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await response.text();
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {}
  return { status: response.status, headers: response.headers, body: parsed, text };
}

/** Every fine the desk holds (`GET /fines`). */
export async function listFines(baseUrl: string): Promise<any[]> {
  return (await fetch(`${baseUrl}/fines`)).json();
}

/** Expects `fine` (as the desk shows it) charged once at the provider: its amount in euros, referenced by its id. */
export async function expectChargedOnce(
  provider: Provider,
  fine: { id: number; chargeId: string; amount: number },
): Promise<void> {
  expect(await chargesFor(provider, fine.id)).toEqual([
    { id: fine.chargeId, amount: fine.amount, currency: 'eur', reference: String(fine.id) },
  ]);
}

/** Waits, polling every `intervalMs`, until the desk's first fine is paid (by its completer), and returns it. */
export async function firstFinePaid(baseUrl: string, timeoutMs: number, intervalMs = 100): Promise<any> {
  await vi.waitFor(async () => expect((await listFines(baseUrl))[0]?.status).toBe('paid'), {
    timeout: timeoutMs,
    interval: intervalMs,
  });
  return (await listFines(baseUrl))[0];
}

/**
 * Where a desk of the fine tests keeps its data and keys: a new SQLite file, a new PostgreSQL
 * schema, or a SQLite file with the keys in Redis (the fines then run as plain steps, no phases)
 * under a new prefix; `cleanup` drops the schemas and the Redis keys made.
 */
export interface FineDatabase {
  name: string;
  skip: boolean;
  /** The desk's `DATABASE_URL` (and `IDEMPOTENCY_STORE`) for a new database, each call. */
  env(): Record<string, string>;
  cleanup(): Promise<void>;
}

const schemas: string[] = [];
const prefixes: string[] = [];
export const FINE_DATABASES: FineDatabase[] = [
  { name: 'SQLite', skip: false, env: () => ({ DATABASE_URL: tempDatabaseUrl() }), cleanup: async () => {} },
  {
    name: 'PostgreSQL',
    skip: !hasPostgres,
    env: () => {
      const schema = uniqueName('rs_fines');
      schemas.push(schema);
      return { DATABASE_URL: `${PG_URL}?schema=${schema}` };
    },
    cleanup: () => dropSchemas(...schemas.splice(0)),
  },
  {
    name: 'SQLite with keys in Redis',
    skip: !hasRedis,
    env: () => {
      const prefix = `${uniqueName('rs_fines')}:`;
      prefixes.push(prefix);
      return { DATABASE_URL: tempDatabaseUrl(), IDEMPOTENCY_STORE: `${REDIS_URL}?prefix=${prefix}` };
    },
    cleanup: () => deleteRedisKeys(...prefixes.splice(0)),
  },
];
