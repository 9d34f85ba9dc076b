import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import type { StoredResponse } from '../src/core/contract/index.js';
import { forAcceptEncoding } from '../src/core/response/index.js';

const text = Buffer.from(JSON.stringify({ books: Array.from({ length: 50 }, (_, i) => `Book ${i}`) }));

function stored(contentEncoding: string, body: Uint8Array): StoredResponse {
  return {
    status: 201,
    headers: {
      'content-type': 'application/json',
      'content-encoding': contentEncoding,
      vary: 'Accept-Encoding',
      'idempotency-replayed': 'true',
    },
    body,
  };
}

describe('a replay stored with a content-encoding', () => {
  it.each([
    ['gzip', gzipSync(text)],
    ['x-gzip', gzipSync(text)],
    ['deflate', deflateSync(text)],
    ['br', brotliCompressSync(text)],
    ['BR', brotliCompressSync(text)],
    // Codings in the order they were applied: deflate first, then gzip.
    ['deflate, gzip', gzipSync(deflateSync(text))],
  ])(
    '%s: decoded for a retry that does not accept it, and only the encoding headers go',
    async (coding, body) => {
      for (const accept of [undefined, '', 'identity', 'compress', 'gzip;q=0, identity']) {
        const replay = await forAcceptEncoding(stored(coding, body), accept);
        expect(Buffer.from(replay.body).equals(text), `${coding} / ${accept}`).toBe(true);
        expect(replay.status).toBe(201);
        expect(replay.headers).toEqual({
          'content-type': 'application/json',
          vary: 'Accept-Encoding',
          'idempotency-replayed': 'true',
        });
      }
    },
  );

  it.each([
    ['gzip', 'gzip'],
    ['gzip', 'br, gzip;q=0.5'],
    ['gzip', '*'],
    ['br', 'gzip, deflate, br'],
    ['deflate, gzip', 'gzip, deflate'],
    ['identity', 'identity'],
  ])('%s: replayed as stored to a retry that accepts %s', async (coding, accept) => {
    const response = stored(coding, gzipSync(text));
    expect(await forAcceptEncoding(response, accept)).toBe(response);
  });

  it('replayed as stored when it cannot be undone: an unknown coding, a body that does not decode, identity refused', async () => {
    for (const [coding, body, accept] of [
      ['compress', text, 'identity'],
      ['gzip', text, 'identity'],
      ['gzip', gzipSync(text), 'br, identity;q=0'],
      ['gzip', gzipSync(text), '*;q=0'],
    ] as const) {
      const response = stored(coding, body);
      expect(await forAcceptEncoding(response, accept), `${coding} / ${accept}`).toBe(response);
    }
  });

  it('a response stored without content-encoding is replayed as it is', async () => {
    const response: StoredResponse = { status: 200, headers: { 'content-type': 'text/plain' }, body: text };
    expect(await forAcceptEncoding(response, 'identity')).toBe(response);
  });
});
