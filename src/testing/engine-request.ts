import type { IncomingRequest } from '../core/adapter.js';

/** A `POST /loans` as an adapter hands it to the engine, with `key` and a JSON `body`. */
export function postRequest<Raw = Record<string, never>>(
  key: string | string[] | undefined,
  body: unknown = { member: 'U-1001', isbn: 'K-02' },
  extra: Partial<IncomingRequest<Raw>> = {},
): IncomingRequest<Raw> {
  return {
    method: 'POST',
    path: '/loans',
    keyHeader: key,
    contentType: 'application/json',
    authorization: undefined,
    readBody: async () => Buffer.from(JSON.stringify(body)),
    raw: {} as Raw,
    ...extra,
  };
}
