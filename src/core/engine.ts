import { createHash } from 'node:crypto';
import { ResponseCollector } from './collector.js';
import { type BodyCipher, bodyCipher, type EncryptionKey } from './crypto.js';
import { type Duration, toMs } from './duration.js';
import { ConfigError, ErrorCode, IdempotencyError, isIdempotencyError } from './errors.js';
import { type FingerprintBody, fingerprint } from './fingerprint.js';
import { parseIdempotencyKey } from './key.js';
import { credentialScope } from './scope.js';
import {
  type AtomicStore,
  type ClaimInput,
  type ClaimResult,
  type IdempotencyStore,
  isAtomicStore,
  type StoredResponse,
} from './types.js';

/** Response headers replayed by default; everything else (set-cookie, date, …) is never stored. */
export const DEFAULT_REPLAY_HEADERS = [
  'content-type',
  'location',
  'content-location',
  'etag',
  'last-modified',
  'link',
  // A body captured after compression is stored compressed: its replay needs the encoding.
  'content-encoding',
  'vary',
] as const;

/** Headers that never reach storage, whatever the allowlist says. */
const NEVER_STORED = new Set(['set-cookie', 'date', 'authorization', 'cookie', 'proxy-authorization']);

export const REPLAYED_HEADER = 'idempotency-replayed';

// Answers to requests that were never accepted: saving them would make the corrected request,
// sent with the same key, a 409 for the whole retention window (Stripe does not save them either).
const NOT_ACCEPTED = new Set([400, 413, 415, 422, 429]);

/** `storeStatus`'s default: every status below 500 except 400, 413, 415, 422 and 429. */
export function defaultStoreStatus(status: number): boolean {
  return status < 500 && !NOT_ACCEPTED.has(status);
}

/**
 * Options of `createIdempotency`. Every duration is ms or a string like `'30s'`, `'7d'`.
 * @typeParam Req the framework's request, handed to `scope`.
 */
export interface IdempotencyOptions<Req = unknown> {
  /** Where records live: `memoryStore()`, `sqliteStore()`, `postgresStore()`, `redisStore()`. */
  store: IdempotencyStore;
  /**
   * `lease`: claim, run, save — at most one concurrent execution; a crash re-runs after the lease.
   * `atomic`: claim, the handler's own writes (through `ctx.tx`) and the saved response commit in
   * one database transaction (SQL stores only) — exactly once for writes in that database.
   * @default 'lease'
   */
  mode?: 'lease' | 'atomic';
  /** Answer 400 when a guarded request has no key. @default false */
  required?: boolean;
  /** Methods guarded by keys; the others pass through untouched. @default ['POST', 'PATCH'] */
  methods?: readonly string[];
  /** Retention: how long a key replays its response; after that it names a new operation. @default '24h' */
  ttl?: Duration;
  /**
   * How long a claim lasts unless renewed. A running handler renews its claim every third of the
   * lease, so this bounds how long a crashed process keeps a key (a retry then runs again), not
   * how long a handler may take. At 10 s a renewal goes out every 3.3 s, so one that fails or
   * stalls is followed by two more before the claim runs out, while a crash holds the key for
   * 10 s at most.
   * @default '10s'
   */
  lease?: Duration;
  /** `wait`: a duplicate of an in-progress request waits for it; `reject`: 409 at once. @default 'wait' */
  concurrency?: 'wait' | 'reject';
  /** How long a duplicate waits for the in-progress original before 409 + Retry-After. @default '10s' */
  wait?: Duration;
  /** `default`: mismatch is 409 with JSON errors; `ietf`: mismatch is 422 with problem+json. @default 'default' */
  profile?: 'default' | 'ietf';
  /**
   * The authenticated client; the same key from two scopes names two operations.
   * @default a digest of the `Authorization` header (`credentialScope`); `''` for requests without one
   */
  scope?: (req: Req) => string | Promise<string>;
  /** Maps a parsed JSON body before fingerprinting, e.g. `({ sentAt, ...rest }) => rest`. */
  fingerprintBody?: FingerprintBody;
  /** Extra response headers to store and replay, besides the defaults. @default [] */
  replayHeaders?: readonly string[];
  /**
   * Which statuses are saved; the others release the key, so a retry runs again. By default
   * 5xx are released (the retry may succeed), and so are 400, 413, 415, 422 and 429: the request
   * was never accepted, and the corrected one may reuse the key. Compose with `defaultStoreStatus`.
   * @default defaultStoreStatus: status < 500, except 400, 413, 415, 422, 429
   */
  storeStatus?: (status: number) => boolean;
  /** Shortest and longest key accepted. @default 1, 255 */
  minKeyLength?: number;
  maxKeyLength?: number;
  /** Largest request body read, in bytes (413 beyond). @default 1 MiB */
  maxBodyBytes?: number;
  /** Largest response kept for replay, in bytes. @default 1 MiB */
  maxResponseBytes?: number;
  /** Bound on a single store call, so a stuck database answers 503 instead of hanging. @default '5s' */
  storeTimeout?: Duration;
  /**
   * 32-byte key (Uint8Array or base64) to encrypt stored bodies with AES-256-GCM, or a key ring
   * `[current, ...previous]`: bodies are encrypted with the first and decrypted with any, so
   * records written before a rotation still replay. Drop a previous key once `ttl` has passed.
   */
  encryptionKey?: EncryptionKey | readonly EncryptionKey[];
  /** Renders engine errors; return `undefined` to keep the default JSON rendering. */
  onError?: (error: IdempotencyError) => StoredResponse | undefined;
}

/** What an adapter knows of an incoming request. */
export interface IncomingRequest<Req = unknown> {
  method: string;
  /** Path and query string. */
  path: string;
  /** The `Idempotency-Key` header: an array when it appeared more than once. */
  keyHeader: string | readonly string[] | undefined;
  contentType: string | undefined;
  /** The `Authorization` header, for the default `scope`. */
  authorization: string | undefined;
  /** Reads the body; called at most once and only for guarded requests. */
  readBody: () => Promise<Uint8Array>;
  /** The framework's request, handed to `scope`. */
  raw: Req;
}

/** Handed to the handler of a guarded request. */
export interface IdempotencyContext<Tx = unknown> {
  key: string;
  scope: string;
  fingerprint: string;
  /** The open transaction in atomic mode (the store's client); `undefined` in lease mode. */
  tx: Tx | undefined;
  /** A key for a downstream provider derived from ours, so its retries are idempotent too. */
  downstreamKey(purpose: string): string;
}

/** A response as an adapter captured it from the handler. */
export interface CapturedResponse extends StoredResponse {
  /** `false` when the body outgrew `maxResponseBytes` and was streamed, not kept. */
  complete: boolean;
}

/**
 * What the adapter does next.
 * - `pass`: not guarded (method, no key on an optional route): run the handler as usual.
 * - `executed`: the handler ran; send `response` unless the adapter already streamed it.
 * - `replayed`: send the stored response (it carries `Idempotency-Replayed: true`).
 * - `rejected`: send `engine.render(error)`, or hand `error` to the framework's error path.
 */
export type Outcome =
  | { kind: 'pass' }
  | { kind: 'executed'; response: CapturedResponse }
  | { kind: 'replayed'; response: StoredResponse }
  | { kind: 'rejected'; error: IdempotencyError };

export interface Idempotency<Req = unknown, Tx = unknown> {
  readonly mode: 'lease' | 'atomic';
  readonly maxBodyBytes: number;
  readonly maxResponseBytes: number;
  /** Runs one request through the state machine; `run` invokes the handler and captures its response. */
  handle(
    request: IncomingRequest<Req>,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome>;
  /** The HTTP response for an engine error: `onError`'s, or JSON (`ietf`: problem+json). */
  render(error: IdempotencyError): StoredResponse;
  /** The 413 error an adapter's `readBody` throws past `maxBodyBytes`; `handle` answers it. */
  bodyTooLarge(): IdempotencyError;
  /** A collector for one handler's response, which the adapter feeds as the response goes out. */
  collect(): ResponseCollector;
}

const MiB = 1024 * 1024;

/**
 * Rejects promises still pending after `timeoutMs`. One unref'd sweep timer serves every pending
 * call (armed only while calls are pending): a timer per store call cost more than the call itself.
 */
function deadlineGuard(timeoutMs: number, message: string) {
  const pending = new Set<{ deadlineMs: number; reject: (error: Error) => void }>();
  let sweeper: NodeJS.Timeout | undefined;
  const sweep = () => {
    const now = Date.now();
    for (const call of pending) {
      if (call.deadlineMs <= now) {
        pending.delete(call);
        call.reject(new Error(message));
      }
    }
    if (pending.size === 0) {
      clearInterval(sweeper);
      sweeper = undefined;
    }
  };
  return function guard<T>(promise: Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const call = { deadlineMs: Date.now() + timeoutMs, reject };
      pending.add(call);
      if (!sweeper) {
        sweeper = setInterval(sweep, Math.max(1, Math.min(100, Math.floor(timeoutMs / 4))));
        sweeper.unref();
      }
      promise.then(
        (value) => {
          pending.delete(call);
          resolve(value);
        },
        (error) => {
          pending.delete(call);
          reject(error);
        },
      );
    });
  };
}

interface HeldLease {
  scope: string;
  key: string;
  token: string;
  renewAtMs: number;
}

/**
 * Renews the leases of running handlers, so a live handler never loses its claim and a crashed
 * one (whose renewals die with it) frees its key within one lease. One unref'd timer serves every
 * held lease (armed only while leases are held), as in `deadlineGuard`. Each lease is renewed
 * every third of its length, whether or not the previous renewal has answered, so a renewal lost
 * or stuck on a slow store is followed by another before the lease runs out. A renewal answered
 * `false` means the lease was lost (another request took the key over): it is renewed no more.
 */
function leaseKeeper(store: IdempotencyStore, leaseMs: number) {
  const renewEveryMs = Math.max(1, Math.floor(leaseMs / 3));
  const held = new Set<HeldLease>();
  let ticker: NodeJS.Timeout | undefined;
  const tick = () => {
    const now = Date.now();
    for (const lease of held) {
      if (lease.renewAtMs > now) continue;
      lease.renewAtMs = now + renewEveryMs;
      // A failed renewal is simply sent again when the next one is due.
      Promise.resolve()
        .then(() => store.renew(lease.scope, lease.key, lease.token, leaseMs))
        .then(
          (renewed) => {
            if (!renewed) held.delete(lease);
          },
          () => undefined,
        );
    }
    if (held.size === 0) {
      clearInterval(ticker);
      ticker = undefined;
    }
  };
  return {
    hold(scope: string, key: string, token: string): HeldLease {
      const lease = { scope, key, token, renewAtMs: Date.now() + renewEveryMs };
      held.add(lease);
      if (!ticker) {
        ticker = setInterval(tick, Math.max(1, Math.floor(renewEveryMs / 4)));
        ticker.unref();
      }
      return lease;
    },
    drop(lease: HeldLease): void {
      held.delete(lease);
    },
  };
}

/**
 * A handler finished after another request took its key over, so the work may have run twice.
 * A log line until the engine has an event hook.
 */
function reportLostLease(storeName: string, key: string, step: 'complete' | 'release'): void {
  console.warn(
    `retrysafe: the lease on Idempotency-Key ${JSON.stringify(key)} (${storeName} store) was lost while its handler ran; another request took the key over, so its ${step} was refused and the handler may have run twice`,
  );
}

// A duplicate polls no slower than this while it waits, so a missed notification costs little.
const MAX_WAIT_SLICE_MS = 1000;

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

/**
 * Creates the engine adapters wrap. Options are checked here, once.
 * @example
 * const idempotency = createIdempotency({ store: sqliteStore({ filename: 'app.db' }), ttl: '7d' });
 */
export function createIdempotency<Req = unknown, Tx = unknown>(
  options: IdempotencyOptions<Req>,
): Idempotency<Req, Tx> {
  const { store } = options ?? ({} as IdempotencyOptions<Req>);
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
  const concurrency = oneOf('concurrency', options.concurrency, ['wait', 'reject']);
  const profile = oneOf('profile', options.profile, ['default', 'ietf']);
  const ttlMs = toMs('ttl', options.ttl ?? '24h', { min: 1 });
  const leaseMs = toMs('lease', options.lease ?? '10s', { min: 1 });
  if (leaseMs > ttlMs) throw new ConfigError('retrysafe: option `lease` must not exceed `ttl`');
  const waitMs = toMs('wait', options.wait ?? '10s');
  const storeTimeoutMs = toMs('storeTimeout', options.storeTimeout ?? '5s', { min: 1 });
  const minKeyLength = positiveInt('minKeyLength', options.minKeyLength, 1);
  const maxKeyLength = positiveInt('maxKeyLength', options.maxKeyLength, 255);
  if (minKeyLength > maxKeyLength) {
    throw new ConfigError('retrysafe: option `minKeyLength` must not exceed `maxKeyLength`');
  }
  const maxBodyBytes = positiveInt('maxBodyBytes', options.maxBodyBytes, MiB);
  const maxResponseBytes = positiveInt('maxResponseBytes', options.maxResponseBytes, MiB);
  if (options.methods !== undefined && !Array.isArray(options.methods)) {
    throw new ConfigError('retrysafe: option `methods` must be an array of HTTP methods');
  }
  const methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
  for (const fn of ['scope', 'fingerprintBody', 'storeStatus', 'onError'] as const) {
    if (options[fn] !== undefined && typeof options[fn] !== 'function') {
      throw new ConfigError(`retrysafe: option \`${fn}\` must be a function`);
    }
  }
  const userScope = options.scope;
  const scopeOf = userScope
    ? (request: IncomingRequest<Req>) => userScope(request.raw)
    : (request: IncomingRequest<Req>) => credentialScope(request.authorization);
  const storeStatus = options.storeStatus ?? defaultStoreStatus;
  const replayHeaders = new Set(
    [...DEFAULT_REPLAY_HEADERS, ...(options.replayHeaders ?? [])].map((h) => h.toLowerCase()),
  );
  for (const header of NEVER_STORED) replayHeaders.delete(header);
  const storedHeaderNames = [...replayHeaders];
  const overflow = mode === 'lease' ? 'stream' : 'drop';
  const cipher: BodyCipher | undefined =
    options.encryptionKey === undefined ? undefined : bodyCipher(options.encryptionKey);
  const bounds = { minLength: minKeyLength, maxLength: maxKeyLength };
  const mismatchStatus = profile === 'ietf' ? 422 : 409;

  function toStored(response: StoredResponse): StoredResponse {
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(response.headers)) {
      const lower = name.toLowerCase();
      if (replayHeaders.has(lower)) headers[lower] = value;
    }
    return { status: response.status, headers, body: cipher ? cipher.seal(response.body) : response.body };
  }

  function toReplay(stored: StoredResponse): StoredResponse {
    return {
      status: stored.status,
      headers: { ...stored.headers, [REPLAYED_HEADER]: 'true' },
      body: cipher ? cipher.open(stored.body) : stored.body,
    };
  }

  function storeDown(cause: unknown, key: string): IdempotencyError {
    return new IdempotencyError(
      503,
      ErrorCode.storeUnavailable,
      'The idempotency store is unavailable; the request was not processed. Retry with the same key.',
      { 'retry-after': '1' },
      key,
      { cause },
    );
  }

  const guard = deadlineGuard(
    storeTimeoutMs,
    `${store.name} store did not answer within ${storeTimeoutMs} ms`,
  );

  function replayOrError(stored: StoredResponse, key: string): Outcome {
    try {
      return { kind: 'replayed', response: toReplay(stored) };
    } catch (cause) {
      return {
        kind: 'rejected',
        error: new IdempotencyError(
          500,
          ErrorCode.replayUnreadable,
          'The stored response for this key cannot be decrypted with the configured encryptionKey.',
          {},
          key,
          { cause },
        ),
      };
    }
  }

  const conflict = (key: string) =>
    new IdempotencyError(
      mismatchStatus,
      ErrorCode.keyConflict,
      'This Idempotency-Key was already used with a different request (method, path or body).',
      {},
      key,
    );
  const inProgress = (key: string, retryAfterMs: number) =>
    new IdempotencyError(
      409,
      ErrorCode.inProgress,
      'A request with this Idempotency-Key is still being processed. Retry later with the same key.',
      { 'retry-after': String(Math.max(1, Math.ceil(Math.min(retryAfterMs, MAX_WAIT_SLICE_MS) / 1000))) },
      key,
    );

  function context(claim: ClaimInput, tx: Tx | undefined): IdempotencyContext<Tx> {
    return {
      key: claim.key,
      scope: claim.scope,
      fingerprint: claim.fingerprint,
      tx,
      downstreamKey: (purpose) =>
        createHash('sha256').update(`${claim.scope}\n${claim.key}\n${purpose}`).digest('base64url'),
    };
  }

  const leases = leaseKeeper(store, leaseMs);

  async function release(claim: ClaimInput, token: string): Promise<void> {
    const released = await guard(store.release(claim.scope, claim.key, token)).catch(() => undefined);
    if (released === false) reportLostLease(store.name, claim.key, 'release');
  }

  async function runLeased(
    claim: ClaimInput,
    token: string,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome> {
    const lease = leases.hold(claim.scope, claim.key, token);
    let response: CapturedResponse;
    try {
      response = await run(context(claim, undefined));
    } catch (error) {
      leases.drop(lease);
      // The handler failed: free the key so the client's retry runs again, then let the
      // framework answer the error as it would without us.
      await release(claim, token);
      throw error;
    }
    leases.drop(lease);
    if (response.complete && storeStatus(response.status)) {
      const stored = toStored(response);
      // A failed save leaves the record in progress until its lease passes: retries wait or get
      // 409 rather than running the work a second time while this response is on its way.
      const saved = await guard(store.complete(claim.scope, claim.key, token, stored)).catch(() => undefined);
      if (saved === false) return answerLate(claim, response, stored);
    } else {
      await release(claim, token);
    }
    return { kind: 'executed', response };
  }

  /**
   * The handler finished after another request took its key over, so its response was not saved
   * and must not be sent as if it were: the client gets the answer saved for the key when there
   * is one, 409 + Retry-After while the other request runs, and this response only once it is
   * saved (when nothing else was).
   */
  async function answerLate(
    claim: ClaimInput,
    response: CapturedResponse,
    stored: StoredResponse,
  ): Promise<Outcome> {
    reportLostLease(store.name, claim.key, 'complete');
    const busy = (): Outcome => ({ kind: 'rejected', error: inProgress(claim.key, leaseMs) });
    let result: ClaimResult;
    try {
      result = await guard(store.claim(claim));
    } catch {
      return busy();
    }
    switch (result.outcome) {
      case 'replay':
        return replayOrError(result.response, claim.key);
      case 'mismatch':
        return { kind: 'rejected', error: conflict(claim.key) };
      case 'in_progress':
        return { kind: 'rejected', error: inProgress(claim.key, result.retryAfterMs) };
      case 'acquired': {
        // Nothing was saved (the request that took over failed, or retention passed): this
        // response is what the work produced, so it is saved now and then sent.
        const saved = await guard(store.complete(claim.scope, claim.key, result.token, stored)).catch(
          () => false,
        );
        return saved ? { kind: 'executed', response } : busy();
      }
    }
  }

  async function runAtomic(
    claim: ClaimInput,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome | { kind: 'in_progress'; retryAfterMs: number }> {
    let handlerFailed = false;
    let handlerError: unknown;
    let captured: CapturedResponse | undefined;
    try {
      const result = await (store as AtomicStore<Tx>).atomic(claim, async (tx) => {
        try {
          captured = await run(context(claim, tx));
        } catch (error) {
          handlerFailed = true;
          handlerError = error;
          throw error;
        }
        if (!captured.complete) {
          // Nothing may reach the client before the commit, so an oversized response cannot be
          // streamed: roll everything back and say why.
          return { response: toStored(captured), commit: false };
        }
        return { response: toStored(captured), commit: storeStatus(captured.status) };
      });
      switch (result.outcome) {
        case 'executed':
          if (!captured!.complete) {
            return {
              kind: 'rejected',
              error: new IdempotencyError(
                500,
                ErrorCode.responseTooLarge,
                `The response exceeded maxResponseBytes (${maxResponseBytes}); the operation was rolled back.`,
                {},
                claim.key,
              ),
            };
          }
          return { kind: 'executed', response: captured! };
        case 'replay':
          return replayOrError(result.response, claim.key);
        case 'mismatch':
          return { kind: 'rejected', error: conflict(claim.key) };
        case 'in_progress':
          return { kind: 'in_progress', retryAfterMs: result.retryAfterMs };
      }
    } catch (error) {
      if (handlerFailed) throw handlerError;
      return { kind: 'rejected', error: storeDown(error, claim.key) };
    }
  }

  async function handle(
    request: IncomingRequest<Req>,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome> {
    if (!methods.has(request.method.toUpperCase())) return { kind: 'pass' };
    const parsed = parseIdempotencyKey(request.keyHeader, bounds);
    if (parsed.ok === 'absent') {
      if (!options.required) return { kind: 'pass' };
      return {
        kind: 'rejected',
        error: new IdempotencyError(
          400,
          ErrorCode.keyMissing,
          'This endpoint requires an Idempotency-Key header.',
        ),
      };
    }
    if (!parsed.ok) {
      return { kind: 'rejected', error: new IdempotencyError(400, ErrorCode.keyInvalid, parsed.reason) };
    }
    const { key } = parsed;
    let body: Uint8Array;
    try {
      body = await request.readBody();
    } catch (error) {
      if (isIdempotencyError(error)) return { kind: 'rejected', error };
      throw error;
    }
    const claim: ClaimInput = {
      scope: await scopeOf(request),
      key,
      fingerprint: fingerprint(
        { method: request.method, path: request.path, contentType: request.contentType, body },
        options.fingerprintBody,
      ),
      leaseMs,
      ttlMs,
      timeoutMs: storeTimeoutMs,
    };

    const deadline = Date.now() + (concurrency === 'wait' ? waitMs : 0);
    for (;;) {
      let retryAfterMs: number;
      if (mode === 'atomic') {
        // In atomic mode a duplicate's claim waits on the original's open transaction: within `wait`.
        const outcome = await runAtomic({ ...claim, waitMs: Math.max(0, deadline - Date.now()) }, run);
        if (outcome.kind !== 'in_progress') return outcome;
        retryAfterMs = outcome.retryAfterMs;
      } else {
        let result: Awaited<ReturnType<IdempotencyStore['claim']>>;
        const claiming = store.claim(claim);
        try {
          result = await guard(claiming);
        } catch (error) {
          // The client is told nothing ran, so a claim that still lands after the timeout must not
          // hold the key for a whole lease: it is released as soon as it answers.
          claiming
            .then(
              (late) => late.outcome === 'acquired' && store.release(claim.scope, key, late.token),
              () => undefined,
            )
            .catch(() => undefined);
          return { kind: 'rejected', error: storeDown(error, key) };
        }
        switch (result.outcome) {
          case 'acquired':
            return runLeased(claim, result.token, run);
          case 'replay':
            return replayOrError(result.response, key);
          case 'mismatch':
            return { kind: 'rejected', error: conflict(key) };
        }
        retryAfterMs = result.retryAfterMs;
      }
      const remainingMs = deadline - Date.now();
      if (remainingMs <= 0) return { kind: 'rejected', error: inProgress(key, retryAfterMs) };
      try {
        await store.wait(claim.scope, key, Math.min(remainingMs, retryAfterMs + 1, MAX_WAIT_SLICE_MS));
      } catch (error) {
        return { kind: 'rejected', error: storeDown(error, key) };
      }
    }
  }

  function render(error: IdempotencyError): StoredResponse {
    const custom = options.onError?.(error);
    if (custom) return custom;
    if (profile === 'ietf') {
      const problem = { type: `about:blank`, title: error.code, status: error.status, detail: error.message };
      return {
        status: error.status,
        headers: { ...error.headers, 'content-type': 'application/problem+json' },
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
      headers: { ...error.headers, 'content-type': 'application/json; charset=utf-8' },
      body: Buffer.from(JSON.stringify(payload)),
    };
  }

  return {
    mode,
    maxBodyBytes,
    maxResponseBytes,
    handle,
    render,
    bodyTooLarge: () =>
      new IdempotencyError(413, ErrorCode.bodyTooLarge, `The request body exceeds ${maxBodyBytes} bytes.`),
    collect: () => new ResponseCollector(maxResponseBytes, overflow, storedHeaderNames),
  };
}
