import type { IdempotencyError, StoredResponse } from '../contract/index.js';
import { keyHeaderValue } from '../request/key.js';
import type { BodyCipher } from './crypto.js';

/** The resolved options that shape stored responses and rendered errors. */
export interface ResponseShaping {
  readonly replayHeaders: ReadonlySet<string>;
  /** Lower-case, or `undefined` for no replay header. */
  readonly replayedHeader: string | undefined;
  /** The lower-case header every answer to a keyed request echoes its key in (`echoKey`), or `undefined`. */
  readonly echoKeyHeader: string | undefined;
  readonly cipher: BodyCipher | undefined;
  readonly mismatchStatus: number;
  /** Linked from every rendered error (`docsUrl`); `undefined` for no link. */
  readonly docsUrl: string | undefined;
  readonly profile: 'default' | 'ietf';
  readonly onError: ((error: IdempotencyError) => StoredResponse | undefined) | undefined;
  readonly maxBodyBytes: number;
  readonly maxResponseBytes: number;
}

export function toStored(config: ResponseShaping, response: StoredResponse): StoredResponse {
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

/** A copy of `headers` with `name` set to `value`. */
export function withHeader<V>(headers: Record<string, V>, name: string, value: V): Record<string, V> {
  return { ...headers, [name]: value };
}

/** The headers every answer to a request keyed `key` carries besides its own: `echoKey`'s. */
export function answerHeaders(config: ResponseShaping, key: string): Readonly<Record<string, string>> {
  if (config.echoKeyHeader === undefined) return NO_HEADERS;
  return { [config.echoKeyHeader]: keyHeaderValue(key, config.profile === 'ietf') };
}
const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});

/** `headers` with `echoKey`'s header added, when that option is on. */
export function withKeyEcho(
  config: ResponseShaping,
  headers: Record<string, string>,
  key: string,
): Record<string, string> {
  return config.echoKeyHeader === undefined
    ? headers
    : withHeader(headers, config.echoKeyHeader, keyHeaderValue(key, config.profile === 'ietf'));
}

export function toReplay(config: ResponseShaping, stored: StoredResponse, key: string): StoredResponse {
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
