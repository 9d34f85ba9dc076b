import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';

/** The parts of a request that decide whether a retry is the same request. */
export interface FingerprintInput {
  method: string;
  /** Path and query string as the client sent them. */
  path: string;
  contentType: string | undefined;
  body: Uint8Array;
}

/** Maps a parsed JSON body before it is hashed, e.g. to drop a volatile field. */
export type FingerprintBody = (body: unknown) => unknown;

const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

/**
 * sha256 over method, path and body. A JSON body is hashed in its RFC 8785 canonical form, so key
 * order and whitespace do not make two equal requests differ; any other body is hashed as bytes.
 */
export function fingerprint(input: FingerprintInput, mapBody?: FingerprintBody): string {
  const head = `${input.method.toUpperCase()}\n${input.path}\n`;
  const canonical =
    input.contentType && JSON_TYPE.test(input.contentType) ? canonicalJson(input.body, mapBody) : undefined;
  const hash = createHash('sha256');
  if (canonical === undefined) hash.update(`${head}bytes\n`).update(input.body);
  else hash.update(`${head}json\n${canonical}`);
  return hash.digest('hex');
}

function canonicalJson(body: Uint8Array, mapBody?: FingerprintBody): string | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('utf8'));
  } catch {
    // Not JSON after all: the bytes are the request; the handler will answer the parse error.
    return undefined;
  }
  return canonicalize(mapBody ? mapBody(parsed) : parsed);
}
