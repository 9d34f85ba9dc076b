import { startProvider } from '../../examples/payment-provider/provider.js';
import { tempDatabaseUrl } from './loan-desk.js';
import { dropSchemas, hasPostgres, PG_URL, uniqueName } from './services.js';

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

/** A desk database for the fine tests: a new SQLite file, or a new PostgreSQL schema dropped by `cleanup`. */
export interface FineDatabase {
  name: string;
  skip: boolean;
  /** A new database each call. */
  url(): string;
  cleanup(): Promise<void>;
}

const schemas: string[] = [];
export const FINE_DATABASES: FineDatabase[] = [
  { name: 'SQLite', skip: false, url: () => tempDatabaseUrl(), cleanup: async () => {} },
  {
    name: 'PostgreSQL',
    skip: !hasPostgres,
    url: () => {
      const schema = uniqueName('rs_fines');
      schemas.push(schema);
      return `${PG_URL}?schema=${schema}`;
    },
    cleanup: () => dropSchemas(...schemas.splice(0)),
  },
];
