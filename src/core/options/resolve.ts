import type { IdempotencyEventListener } from '../contract/index.js';
import {
  ConfigError,
  type IdempotencyError,
  type IdempotencyStore,
  isAtomicStore,
  type StoredResponse,
} from '../contract/index.js';
import type { FingerprintBody, IncomingRequest, KeyBounds } from '../request/index.js';
import { checkScopeSecret, credentialScope, storableScope } from '../request/index.js';
import { type BodyCipher, bodyCipher } from '../response/index.js';
import { toMs } from './duration.js';
import {
  DEFAULT_REPLAY_HEADERS,
  defaultStoreStatus,
  ENGINE_OPTION_NAMES,
  type IdempotencyOptions,
  IETF_DRAFT_ERRORS_URL,
  REPLAYED_HEADER,
} from './types.js';
import { checkOptions } from './validate.js';

/** Headers that never reach storage, whatever the allowlist says. */
const NEVER_STORED = new Set(['set-cookie', 'date', 'authorization', 'cookie', 'proxy-authorization']);

const MiB = 1024 * 1024;
/**
 * Default bound on a step's saved result: a step saves ids and amounts, and every claim of the key
 * (each retry, each completer pass) reads all its steps back, so a large one slows every one of
 * them (a 64 MB step made each later claim time out).
 */
const MAX_STEP_BYTES = 64 * 1024;

/**
 * The longest `maxKeyLength`: with a scope of MAX_SCOPE_BYTES a key this long (printable ASCII,
 * a byte a character) keeps PostgreSQL's index row of (scope, key) within its 2,704 bytes.
 */
export const MAX_KEY_LENGTH = 1024;

/** How many store calls in a row must fail to open the circuit, and how long it stays open. */
export interface BreakerSettings {
  readonly failures: number;
  readonly cooldownMs: number;
}

/** `circuitBreaker`: its settings, or `undefined` when turned off. */
function breakerOption(given: IdempotencyOptions['circuitBreaker']): BreakerSettings | undefined {
  if (given === false) return undefined;
  if (given !== undefined && (typeof given !== 'object' || given === null)) {
    throw new ConfigError('retrysafe: option `circuitBreaker` must be false or { failures, cooldown }');
  }
  const unknown = Object.keys(given ?? {}).filter((name) => name !== 'failures' && name !== 'cooldown');
  if (unknown.length > 0) {
    throw new ConfigError(
      `retrysafe: option \`circuitBreaker\` knows \`failures\` and \`cooldown\`; got \`${unknown[0]}\``,
    );
  }
  return {
    failures: positiveInt('circuitBreaker.failures', given?.failures, 5),
    cooldownMs: toMs('circuitBreaker.cooldown', given?.cooldown ?? '1s', { min: 1 }),
  };
}

function positiveInt(option: string, value: number | undefined, fallback: number): number {
  const resolved = value ?? fallback;
  if (!Number.isSafeInteger(resolved) || resolved < 1) {
    throw new ConfigError(`retrysafe: option \`${option}\` must be a positive integer; got ${String(value)}`);
  }
  return resolved;
}

function oneOf<T extends string>(option: string, value: T | undefined, allowed: readonly T[]): T {
  const resolved = value ?? (allowed[0] as T);
  if (!allowed.includes(resolved)) {
    throw new ConfigError(
      `retrysafe: option \`${option}\` must be one of ${allowed.map((a) => `'${a}'`).join(', ')}; got ${JSON.stringify(value)}`,
    );
  }
  return resolved;
}

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

function headerNameOption(option: string, value: unknown): string {
  if (typeof value !== 'string' || !TOKEN.test(value)) {
    throw new ConfigError(
      `retrysafe: option \`${option}\` must be an HTTP header name; got ${JSON.stringify(value)}`,
    );
  }
  return value;
}

// Absolute, and without the characters that would end a `Link` header's `<…>` or the header itself.
function docsUrlOption(value: unknown): string | undefined {
  if (value === undefined) return undefined;
  if (
    typeof value === 'string' &&
    URL.canParse(value) &&
    /^[\x21-\x7e]+$/.test(value) &&
    !/[<>]/.test(value)
  ) {
    return value;
  }
  throw new ConfigError(
    `retrysafe: option \`docsUrl\` must be an absolute URL of printable ASCII; got ${JSON.stringify(value)}`,
  );
}

/** The options as the engine runs with them: checked, defaulted, in milliseconds and bytes. */
export interface ResolvedOptions<Req = unknown> {
  readonly store: IdempotencyStore;
  readonly mode: 'lease' | 'atomic';
  /** The lower-case header the key is read from; `undefined` when the `key` option reads it. */
  readonly keyHeader: string | undefined;
  readonly keyOf: ((req: Req) => string | undefined | Promise<string | undefined>) | undefined;
  readonly required: boolean;
  readonly concurrency: 'wait' | 'reject';
  readonly profile: 'default' | 'ietf';
  readonly ttlMs: number;
  readonly leaseMs: number;
  readonly waitMs: number;
  readonly storeTimeoutMs: number;
  /** `undefined`: no circuit breaker. */
  readonly breaker: BreakerSettings | undefined;
  readonly bounds: KeyBounds;
  readonly maxBodyBytes: number;
  readonly maxResponseBytes: number;
  readonly maxStepBytes: number;
  readonly route: string | undefined;
  readonly maxResumes: number;
  readonly methods: ReadonlySet<string>;
  readonly scopeOf: (request: IncomingRequest<Req>) => string | Promise<string>;
  readonly fingerprintBody: FingerprintBody | undefined;
  readonly storeStatus: (status: number) => boolean;
  /** Lower-case names of the headers stored and replayed. */
  readonly replayHeaders: ReadonlySet<string>;
  readonly storedHeaderNames: readonly string[];
  /** The lower-case header a replay carries, or `undefined` for none. */
  readonly replayedHeader: string | undefined;
  /** The lower-case header every answer to a keyed request echoes its key in (`echoKey`), or `undefined`. */
  readonly echoKeyHeader: string | undefined;
  readonly cipher: BodyCipher | undefined;
  readonly mismatchStatus: number;
  /** `docsUrl` as given, or the draft's under `profile: 'ietf'`; `undefined` for none. */
  readonly docsUrl: string | undefined;
  readonly onError: ((error: IdempotencyError) => StoredResponse | undefined) | undefined;
  readonly onEvent: IdempotencyEventListener | undefined;
}

/** Checks every option once, at construction, and throws a ConfigError naming the first bad one. */
export function resolveOptions<Req, Tx>(given: IdempotencyOptions<Req, Tx>): ResolvedOptions<Req> {
  const options = checkOptions('createIdempotency()', given, ENGINE_OPTION_NAMES);
  const { store } = options;
  if (!store || typeof store.claim !== 'function' || typeof store.complete !== 'function') {
    throw new ConfigError('retrysafe: option `store` is required and must implement the store contract');
  }
  const mode = oneOf('mode', options.mode, ['lease', 'atomic']);
  if (mode === 'atomic' && !isAtomicStore(store)) {
    throw new ConfigError(
      `retrysafe: option \`mode: 'atomic'\` needs a store with transactions; ${store.name} has none`,
    );
  }
  if (mode === 'lease' && typeof store.renew !== 'function') {
    throw new ConfigError(
      `retrysafe: ${store.name} store has no \`renew\`, which lease mode needs to keep running handlers' claims`,
    );
  }
  const profile = oneOf('profile', options.profile, ['default', 'ietf']);
  // The draft (§2.7): a request retried while the original is processed SHOULD get 409.
  const concurrency =
    options.concurrency === undefined && profile === 'ietf'
      ? 'reject'
      : oneOf('concurrency', options.concurrency, ['wait', 'reject']);
  const docsUrl = docsUrlOption(options.docsUrl) ?? (profile === 'ietf' ? IETF_DRAFT_ERRORS_URL : undefined);
  const ttlMs = toMs('ttl', options.ttl ?? '24h', { min: 1 });
  // A record must outlive its lease (expired while its owner still ran, it would let a retry run
  // the handler twice), and stores keep a record for `ttl` as given (the claim's `retainMs`): a
  // lease past a short retention (a demo's '2s') is shortened to it, and renewals keep a running
  // handler's claim however short it is.
  const leaseMs = Math.min(toMs('lease', options.lease ?? '10s', { min: 1 }), ttlMs);
  const waitMs = toMs('wait', options.wait ?? '10s');
  const storeTimeoutMs = toMs('storeTimeout', options.storeTimeout ?? '5s', { min: 1 });
  const breaker = breakerOption(options.circuitBreaker);
  const minKeyLength = positiveInt('minKeyLength', options.minKeyLength, 1);
  const maxKeyLength = positiveInt('maxKeyLength', options.maxKeyLength, 255);
  if (maxKeyLength > MAX_KEY_LENGTH) {
    throw new ConfigError(
      `retrysafe: option \`maxKeyLength\` must be at most ${MAX_KEY_LENGTH}, the longest key every store indexes (PostgreSQL refuses index rows past 2,704 bytes); got ${maxKeyLength}`,
    );
  }
  if (minKeyLength > maxKeyLength) {
    throw new ConfigError('retrysafe: option `minKeyLength` must not exceed `maxKeyLength`');
  }
  const maxBodyBytes = positiveInt('maxBodyBytes', options.maxBodyBytes, MiB);
  const maxResponseBytes = positiveInt('maxResponseBytes', options.maxResponseBytes, MiB);
  const maxStepBytes = positiveInt('maxStepBytes', options.maxStepBytes, MAX_STEP_BYTES);
  const maxResumes = positiveInt('maxResumes', options.maxResumes, 20);
  const { route } = options;
  if (route !== undefined && (typeof route !== 'string' || route === '' || route.length > 200)) {
    throw new ConfigError('retrysafe: option `route` must be a string of 1 to 200 characters');
  }
  if (options.methods !== undefined && !Array.isArray(options.methods)) {
    throw new ConfigError('retrysafe: option `methods` must be an array of HTTP methods');
  }
  const methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
  const headerName = headerNameOption('headerName', options.headerName ?? 'Idempotency-Key');
  const replayedHeader =
    options.replayedHeader === false
      ? undefined
      : headerNameOption('replayedHeader', options.replayedHeader ?? REPLAYED_HEADER).toLowerCase();
  if (options.echoKey !== undefined && typeof options.echoKey !== 'boolean') {
    throw new ConfigError('retrysafe: option `echoKey` must be true or false');
  }
  for (const fn of ['scope', 'key', 'fingerprintBody', 'storeStatus', 'onError', 'onEvent'] as const) {
    if (options[fn] !== undefined && typeof options[fn] !== 'function') {
      throw new ConfigError(`retrysafe: option \`${fn}\` must be a function`);
    }
  }
  const { scope: userScope, scopeSecret } = options;
  if (scopeSecret !== undefined) checkScopeSecret(scopeSecret, 'option `scopeSecret`');
  const scopeOf = userScope
    ? (request: IncomingRequest<Req>) => {
        const scope = userScope(request.raw);
        return typeof scope === 'string' ? storableScope(scope) : scope.then(storableScope);
      }
    : (request: IncomingRequest<Req>) => credentialScope(request.authorization, scopeSecret);
  const storeStatus = options.storeStatus ?? defaultStoreStatus;
  const replayHeaders = new Set(
    [...DEFAULT_REPLAY_HEADERS, ...(options.replayHeaders ?? [])].map((h) => h.toLowerCase()),
  );
  for (const header of NEVER_STORED) replayHeaders.delete(header);
  const storedHeaderNames = [...replayHeaders];
  const cipher: BodyCipher | undefined =
    options.encryptionKey === undefined ? undefined : bodyCipher(options.encryptionKey);
  const bounds = { minLength: minKeyLength, maxLength: maxKeyLength };
  const mismatchStatus = profile === 'ietf' ? 422 : 409;

  return Object.freeze({
    store,
    mode,
    keyHeader: options.key ? undefined : headerName.toLowerCase(),
    keyOf: options.key,
    required: options.required ?? false,
    concurrency,
    profile,
    ttlMs,
    leaseMs,
    waitMs,
    storeTimeoutMs,
    breaker,
    bounds,
    maxBodyBytes,
    maxResponseBytes,
    maxStepBytes,
    route,
    maxResumes,
    methods,
    scopeOf,
    fingerprintBody: options.fingerprintBody,
    storeStatus,
    replayHeaders,
    storedHeaderNames,
    replayedHeader,
    echoKeyHeader: options.echoKey ? headerName.toLowerCase() : undefined,
    cipher,
    mismatchStatus,
    docsUrl,
    onError: options.onError,
    onEvent: options.onEvent,
  });
}
