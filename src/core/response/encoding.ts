import { promisify } from 'node:util';
import { brotliDecompress, gunzip, inflate } from 'node:zlib';
import Negotiator from 'negotiator';
import type { StoredResponse } from '../contract/index.js';

type Decoder = (body: Uint8Array) => Promise<Buffer>;

/** The content codings a replay can undo (RFC 9110 §8.4.1), by name. */
const DECODERS = new Map<string, Decoder>([
  ['gzip', promisify(gunzip)],
  ['x-gzip', promisify(gunzip)],
  ['deflate', promisify(inflate)],
  ['br', promisify(brotliDecompress)],
]);

/**
 * The replay as this retry accepts it. A body a compression middleware encoded for the first
 * request's Accept-Encoding is decoded when the retry's does not accept that coding (it sent
 * `identity`, or no Accept-Encoding at all), and replayed without `content-encoding`; `vary`
 * stays. A coding that cannot be undone here, or a retry that refuses `identity` too, gets the
 * bytes as stored.
 */
export async function forAcceptEncoding(
  response: StoredResponse,
  acceptEncoding: string | undefined,
): Promise<StoredResponse> {
  const applied = response.headers['content-encoding'];
  if (applied === undefined) return response;
  const codings = applied
    .split(',')
    .map((coding) => coding.trim().toLowerCase())
    .filter((coding) => coding !== '' && coding !== 'identity');
  const accepted = new Negotiator({ headers: { 'accept-encoding': acceptEncoding } });
  if (codings.every((coding) => accepted.encoding([coding]) !== undefined)) return response;
  if (accepted.encoding(['identity']) === undefined) return response;
  let body = response.body;
  // The codings are listed in the order they were applied: undo the last first.
  for (const coding of codings.reverse()) {
    const decode = DECODERS.get(coding);
    if (decode === undefined) return response;
    try {
      body = await decode(body);
    } catch {
      return response;
    }
  }
  const { 'content-encoding': _, 'content-length': __, ...headers } = response.headers;
  return { status: response.status, headers, body };
}
