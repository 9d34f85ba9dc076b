import { STATUS_CODES } from 'node:http';
import { promisify } from 'node:util';
import { brotliDecompress, gunzip, inflate } from 'node:zlib';
import Negotiator from 'negotiator';
import { ErrorCode, IdempotencyError } from './errors.js';
import { keyHeaderValue } from './key.js';
import type { ResolvedOptions } from './resolve-options.js';
import type { StoredResponse } from './types.js';

/** The header a replay carries by default (`replayedHeader`). */
export const REPLAYED_HEADER = 'idempotency-replayed';

// A duplicate polls no slower than this while it waits, so a missed notification costs little.
export const MAX_WAIT_SLICE_MS = 1000;

type Shaping = Pick<
  ResolvedOptions,
  | 'replayHeaders'
  | 'replayedHeader'
  | 'echoKeyHeader'
  | 'cipher'
  | 'mismatchStatus'
  | 'profile'
  | 'onError'
  | 'maxBodyBytes'
  | 'maxResponseBytes'
>;

export function toStored(config: Shaping, response: StoredResponse): StoredResponse {
  const headers: Record<string, string> = {};
  for (const name of Object.keys(response.headers)) {
    const lower = name.toLowerCase();
    if (config.replayHeaders.has(lower)) headers[lower] = response.headers[name] as string;
  }
  return {
    status: response.status,
    headers,
    body: config.cipher ? config.cipher.seal(response.body) : response.body,
  };
}

/**
 * A copy of `headers` with `name` set to `value`. V8 takes about 0.5 µs to add a hyphenated name to
 * a copy made by spreading (`{ ...headers, [name]: value }`), ten times this loop (measured on
 * Node 20), and a replay adds two. Names keep their order, as with the spread.
 */
export function withHeader<V>(headers: Record<string, V>, name: string, value: V): Record<string, V> {
  const copy: Record<string, V> = {};
  for (const header of Object.keys(headers)) copy[header] = headers[header] as V;
  copy[name] = value;
  return copy;
}

/** The headers every answer to a request keyed `key` carries besides its own: `echoKey`'s. */
export function answerHeaders(config: Shaping, key: string): Readonly<Record<string, string>> {
  if (config.echoKeyHeader === undefined) return NO_HEADERS;
  return { [config.echoKeyHeader]: keyHeaderValue(key, config.profile === 'ietf') };
}
const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});

function withKeyEcho(config: Shaping, headers: Record<string, string>, key: string): Record<string, string> {
  return config.echoKeyHeader === undefined
    ? headers
    : withHeader(headers, config.echoKeyHeader, keyHeaderValue(key, config.profile === 'ietf'));
}

export function toReplay(config: Shaping, stored: StoredResponse, key: string): StoredResponse {
  return {
    status: stored.status,
    // A copy either way: the memory store hands out the record it keeps.
    headers: withKeyEcho(
      config,
      config.replayedHeader
        ? withHeader(stored.headers, config.replayedHeader, 'true')
        : { ...stored.headers },
      key,
    ),
    body: config.cipher ? config.cipher.open(stored.body) : stored.body,
  };
}

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

export function storeDown(cause: unknown, key: string): IdempotencyError {
  return new IdempotencyError(
    503,
    ErrorCode.storeUnavailable,
    'The idempotency store is unavailable; the request was not processed. Retry with the same key.',
    { 'retry-after': '1' },
    key,
    { cause },
  );
}

export function replayUnreadable(cause: unknown, key: string): IdempotencyError {
  return new IdempotencyError(
    500,
    ErrorCode.replayUnreadable,
    'The stored response for this key cannot be decrypted with the configured encryptionKey.',
    {},
    key,
    { cause },
  );
}

export const conflict = (config: Shaping, key: string) =>
  new IdempotencyError(
    config.mismatchStatus,
    ErrorCode.keyConflict,
    'This Idempotency-Key was already used with a different request (method, path or body).',
    {},
    key,
  );

export const inProgress = (key: string, retryAfterMs: number) =>
  new IdempotencyError(
    409,
    ErrorCode.inProgress,
    'A request with this Idempotency-Key is still being processed. Retry later with the same key.',
    { 'retry-after': String(Math.max(1, Math.ceil(Math.min(retryAfterMs, MAX_WAIT_SLICE_MS) / 1000))) },
    key,
  );

export const keyMissing = () =>
  new IdempotencyError(400, ErrorCode.keyMissing, 'This endpoint requires an Idempotency-Key header.');

export const keyInvalid = (reason: string) => new IdempotencyError(400, ErrorCode.keyInvalid, reason);

export const responseTooLarge = (config: Shaping, key: string) =>
  new IdempotencyError(
    500,
    ErrorCode.responseTooLarge,
    `The response exceeded maxResponseBytes (${config.maxResponseBytes}); the operation was rolled back.`,
    {},
    key,
  );

export const bodyTooLarge = (config: Shaping) =>
  new IdempotencyError(413, ErrorCode.bodyTooLarge, `The request body exceeds ${config.maxBodyBytes} bytes.`);

/** The HTTP response for an engine error: `onError`'s, or JSON (`ietf`: problem+json). */
export function render(config: Shaping, error: IdempotencyError): StoredResponse {
  const rendered = renderError(config, error);
  if (error.key === undefined || config.echoKeyHeader === undefined) return rendered;
  return { ...rendered, headers: withKeyEcho(config, rendered.headers, error.key) };
}

function renderError(config: Shaping, error: IdempotencyError): StoredResponse {
  const custom = config.onError?.(error);
  if (custom) return custom;
  if (config.profile === 'ietf') {
    // RFC 9457 §4.2.1: a problem of type about:blank is titled with the status phrase; our code
    // rides along as an extension member.
    const problem = {
      type: 'about:blank',
      title: STATUS_CODES[error.status] ?? 'Error',
      status: error.status,
      detail: error.message,
      code: error.code,
    };
    return {
      status: error.status,
      headers: withHeader(error.headers, 'content-type', 'application/problem+json'),
      body: Buffer.from(JSON.stringify(problem)),
    };
  }
  const payload = {
    error: error.code,
    message: error.message,
    ...(error.key === undefined ? {} : { key: error.key }),
  };
  return {
    status: error.status,
    headers: withHeader(error.headers, 'content-type', 'application/json; charset=utf-8'),
    body: Buffer.from(JSON.stringify(payload)),
  };
}
