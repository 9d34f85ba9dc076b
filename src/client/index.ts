/**
 * `retrysafe/client`: a `fetch` that names each intent with one `Idempotency-Key` and retries it
 * safely. Runs wherever the standard `fetch`, `Request`, `AbortController` and
 * `crypto.randomUUID()` exist (Node 20+, browsers, Deno, Bun, workers).
 */

// The files themselves, not their folders' faces: those reach node:crypto, and the client runs in browsers.
import { ConfigError, RetrysafeError } from '../core/contract/errors.js';
import { MAX_TIMER_MS, timerMs } from '../core/options/timer.js';
import { checkOptions, optionNames } from '../core/options/validate.js';

export { ConfigError, RetrysafeError } from '../core/contract/index.js';

/** What one attempt ended with. */
export type AttemptOutcome = { kind: 'response'; status: number } | { kind: 'error'; error: unknown };

/** Passed to `onAttempt` after every attempt. */
export interface AttemptEvent {
  /** 1 for the first try. */
  attempt: number;
  /** The key sent on every attempt of this call; `undefined` when the call sends none. */
  key: string | undefined;
  outcome: AttemptOutcome;
  /** The wait before the next attempt; `null` when no attempt follows. */
  delayMs: number | null;
}

/**
 * The defaults ride out a server restart within one lease: the server refuses connections while
 * it restarts, then answers the crashed request's key "in progress" (409 + Retry-After) until
 * its lease passes (10 s by default after the last renewal; a retry meanwhile may wait up to 10 s on the server), and
 * only then runs the retry. `deadlineMs` (60 s) covers that with room to spare; `maxAttempts`
 * stays out of its way even when every jittered wait is short.
 */
export interface RetryingFetchOptions {
  /**
   * The `fetch` to wrap; it receives a fresh `Request` per attempt and an init holding only `signal`.
   * @default globalThis.fetch (looked up at each call)
   * @example fetch: (request, init) => undici.fetch(request, { ...init, dispatcher })
   */
  fetch?: (request: Request, init: { signal: AbortSignal }) => Promise<Response>;
  /**
   * Attempts per call, the first included.
   * @default 20
   * @example maxAttempts: 3
   */
  maxAttempts?: number;
  /**
   * The retry budget: total time for a call, waits and attempts included. An attempt still in flight
   * when it runs out is aborted, and no wait is started that would end past it.
   * @default 60_000
   * @example deadlineMs: 10_000
   */
  deadlineMs?: number;
  /**
   * Backoff before retry n (1-based) is a uniform random delay in [0, min(maxDelayMs, baseDelayMs * 2^(n-1))]
   * ("full jitter"), unless the response carried a `Retry-After`, which is then honoured as sent.
   * @default 250
   * @example baseDelayMs: 50
   */
  baseDelayMs?: number;
  /**
   * The cap of the jittered backoff (not of a server's `Retry-After`).
   * @default 10_000
   * @example maxDelayMs: 2_000
   */
  maxDelayMs?: number;
  /**
   * The longest `Retry-After` honoured: a server asking for a longer wait ends the call at once
   * with a {@link RetryBudgetExceededError} (`reason: 'retryAfter'`) holding its response.
   * @default 30_000
   * @example maxRetryAfterMs: 5_000
   */
  maxRetryAfterMs?: number;
  /**
   * Longest wait for one attempt's response headers; a timed-out attempt is retried.
   * @default undefined (each attempt may use whatever is left of `deadlineMs`)
   * @example attemptTimeoutMs: 5_000
   */
  attemptTimeoutMs?: number;
  /**
   * The request header that carries the key; match the server's `headerName`.
   * @default 'Idempotency-Key'
   * @example headerName: 'X-Idempotency-Key'
   */
  headerName?: string;
  /**
   * Makes the key of a call that was not given one.
   * @default () => globalThis.crypto.randomUUID()
   * @example generateKey: () => `order-${crypto.randomUUID()}`
   */
  generateKey?: () => string;
  /**
   * Called after every attempt, for logging and metrics.
   * @default undefined
   * @example onAttempt: ({ attempt, outcome, delayMs }) => console.log(attempt, outcome, delayMs)
   */
  onAttempt?: (event: AttemptEvent) => void;
}

/**
 * `RequestInit` plus the key of this intent: a string to use it (an `Idempotency-Key` already in
 * `headers` counts as given too), absent to generate one, `false` to send no key. Without a key
 * only the methods idempotent by themselves (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) are retried;
 * any other (POST, PATCH…) is tried once, since a retry could run it twice.
 */
export type RetryingRequestInit = RequestInit & { idempotencyKey?: string | false };

/** `fetch` that retries one intent with one key: what {@link createRetryingFetch} returns. */
export type RetryingFetch = (input: RequestInfo | URL, init?: RetryingRequestInit) => Promise<Response>;

/**
 * Thrown when a call used up `maxAttempts` or `deadlineMs` while every attempt was retryable, or
 * when the server asked for a wait longer than `maxRetryAfterMs`.
 */
export class RetryBudgetExceededError extends RetrysafeError {
  override readonly name = 'RetryBudgetExceededError';
  readonly reason: BudgetReason;
  readonly attempts: number;
  readonly key: string | undefined;
  /** The last retryable response (its body unread), if the last attempt got one; else see `cause`. */
  readonly lastResponse: Response | undefined;

  constructor(init: {
    reason: BudgetReason;
    attempts: number;
    key: string | undefined;
    lastResponse?: Response;
    lastError?: unknown;
  }) {
    const last = init.lastResponse ? `HTTP ${init.lastResponse.status}` : String(init.lastError);
    super(`retry budget exceeded (${init.reason}) after ${init.attempts} attempt(s); last: ${last}`, {
      cause: init.lastError,
    });
    this.reason = init.reason;
    this.attempts = init.attempts;
    this.key = init.key;
    this.lastResponse = init.lastResponse;
  }
}

type BudgetReason = 'attempts' | 'deadline' | 'retryAfter';

/** Recognises the error across duplicate copies of this package. */
export function isRetryBudgetExceededError(error: unknown): error is RetryBudgetExceededError {
  return error instanceof Error && error.name === 'RetryBudgetExceededError';
}

const RETRYABLE_STATUSES = new Set([408, 429, 502, 503, 504]);
// RFC 9110 §9.2.2: repeating these has the effect of sending them once, key or no key.
const IDEMPOTENT_METHODS = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE']);
const IN_PROGRESS_CODES = new Set(['request_in_progress']);
// retrysafe answers `key_conflict` (the seed's code); `key_mismatch` is the other common name.
// A retry of a key reused for another request never helps.
const MISMATCH_CODES = new Set(['key_mismatch', 'key_conflict']);

/**
 * Whether a response means "try the same intent again": 408, 429, 502, 503, 504, and a 409 that
 * says the key is still in progress (a `Retry-After` header or `error: "request_in_progress"`)
 * rather than reused for another request (`error: "key_conflict"`). Reads a 409's body from a clone.
 * @example
 * if (await isRetryableResponse(response)) scheduleRetry();
 */
export async function isRetryableResponse(response: Response): Promise<boolean> {
  if (RETRYABLE_STATUSES.has(response.status)) return true;
  if (response.status !== 409) return false;
  const code = await errorCode(response);
  if (code !== undefined && MISMATCH_CODES.has(code)) return false;
  return response.headers.has('retry-after') || (code !== undefined && IN_PROGRESS_CODES.has(code));
}

async function errorCode(response: Response): Promise<string | undefined> {
  try {
    const body: unknown = await response.clone().json();
    const code = (body as { error?: unknown } | null)?.error;
    return typeof code === 'string' ? code : undefined;
  } catch {
    return undefined;
  }
}

/** `Retry-After` in ms from now: delay-seconds or an HTTP date (RFC 9110 §10.2.3); else `undefined`. */
export function parseRetryAfterMs(value: string | null, nowMs = Date.now()): number | undefined {
  if (value === null) return undefined;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  // Every HTTP-date form starts with a day name; Date.parse alone would also accept '-1' or '2026'.
  const dateMs = /^[A-Za-z]{3}/.test(trimmed) ? Date.parse(trimmed) : Number.NaN;
  return Number.isNaN(dateMs) ? undefined : Math.max(0, dateMs - nowMs);
}

class AttemptTimeoutError extends RetrysafeError {
  override readonly name = 'TimeoutError';
}

function numberOption(name: string, value: number | undefined, fallback: number, min: number): number {
  const resolved = value ?? fallback;
  if (typeof resolved !== 'number' || !Number.isFinite(resolved) || resolved < min) {
    throw new ConfigError(`retrysafe/client: option \`${name}\` must be a finite number >= ${min}`);
  }
  return resolved;
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, timerMs(ms));
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

const OPTION_NAMES = optionNames<RetryingFetchOptions>({
  fetch: true,
  maxAttempts: true,
  deadlineMs: true,
  baseDelayMs: true,
  maxDelayMs: true,
  maxRetryAfterMs: true,
  attemptTimeoutMs: true,
  headerName: true,
  generateKey: true,
  onAttempt: true,
});

/**
 * Makes a `fetch` that sends one `Idempotency-Key` per call (one intent) and the same key on every
 * retry. It retries network errors, timed-out attempts, 408, 429, an in-progress 409, 502, 503 and
 * 504, with full-jitter exponential backoff or the server's `Retry-After`, within `maxAttempts` and
 * the `deadlineMs` budget; it never retries a key mismatch, 422 or any other 4xx, nor 500 (a server
 * bug a retry will not fix), nor a POST or PATCH sent without a key (`idempotencyKey: false`). Any method may carry a key (PATCH, PUT, DELETE…); a server that ignores
 * keys on a method just sees a harmless header. The caller's `signal` aborts both the wait and the
 * attempt in flight and rejects with its reason.
 *
 * @example
 * import { createRetryingFetch, isRetryBudgetExceededError } from 'retrysafe/client';
 *
 * const retryingFetch = createRetryingFetch({ deadlineMs: 10_000, onAttempt: (e) => console.log(e) });
 * try {
 *   const response = await retryingFetch('http://127.0.0.1:8483/loans', {
 *     method: 'POST',
 *     headers: { 'content-type': 'application/json' },
 *     body: JSON.stringify({ member: 'U-1001', isbn: 'K-01', issuedAt: '2026-11-29' }),
 *   });
 *   console.log(response.status, await response.json());
 * } catch (error) {
 *   if (isRetryBudgetExceededError(error)) console.error('gave up', error.attempts, error.key);
 *   else throw error;
 * }
 */
export function createRetryingFetch(given?: RetryingFetchOptions): RetryingFetch {
  const options = checkOptions('createRetryingFetch()', given, OPTION_NAMES);
  const maxAttempts = numberOption('maxAttempts', options.maxAttempts, 20, 1);
  if (!Number.isInteger(maxAttempts)) {
    throw new ConfigError('retrysafe/client: option `maxAttempts` must be an integer');
  }
  const deadlineMs = numberOption('deadlineMs', options.deadlineMs, 60_000, 1);
  // setTimeout fires at once past 2^31-1 ms; every wait and attempt timer stays below the deadline.
  if (deadlineMs > MAX_TIMER_MS) {
    throw new ConfigError(`retrysafe/client: option \`deadlineMs\` must be at most ${MAX_TIMER_MS}`);
  }
  const baseDelayMs = numberOption('baseDelayMs', options.baseDelayMs, 250, 0);
  const maxDelayMs = numberOption('maxDelayMs', options.maxDelayMs, 10_000, 0);
  const maxRetryAfterMs = numberOption('maxRetryAfterMs', options.maxRetryAfterMs, 30_000, 0);
  const attemptTimeoutMs =
    options.attemptTimeoutMs === undefined
      ? Number.POSITIVE_INFINITY
      : numberOption('attemptTimeoutMs', options.attemptTimeoutMs, 0, 1);
  const headerName = options.headerName ?? 'Idempotency-Key';
  if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(headerName)) {
    throw new ConfigError('retrysafe/client: option `headerName` must be an HTTP header name');
  }
  const generateKey = options.generateKey ?? (() => globalThis.crypto.randomUUID());
  const onAttempt = options.onAttempt;

  function resolveKey(headers: Headers, given: string | false | undefined): string | undefined {
    const sent = headers.get(headerName);
    if (given === false) {
      headers.delete(headerName);
      return undefined;
    }
    if (sent !== null && given !== undefined && sent !== given) {
      throw new ConfigError(`retrysafe/client: \`idempotencyKey\` and the ${headerName} header disagree`);
    }
    const key = sent ?? given ?? generateKey();
    if (key === '') throw new ConfigError('retrysafe/client: an idempotency key must not be empty');
    headers.set(headerName, key);
    return key;
  }

  return async function retryingFetch(input, init = {}) {
    const { idempotencyKey, signal: initSignal, ...requestInit } = init;
    const signal = initSignal ?? (input instanceof Request ? input.signal : undefined);
    signal?.throwIfAborted();
    // One template, cloned per attempt, so every attempt sends the same bytes whatever the body type.
    const template = new Request(input, requestInit);
    const key = resolveKey(template.headers, idempotencyKey);
    const retriable = key !== undefined || IDEMPOTENT_METHODS.has(template.method);
    const fetchImpl = options.fetch ?? globalThis.fetch;
    const startedMs = performance.now();
    const remainingMs = () => deadlineMs - (performance.now() - startedMs);

    for (let attempt = 1; ; attempt++) {
      const controller = new AbortController();
      const onCallerAbort = () => controller.abort(signal?.reason);
      signal?.addEventListener('abort', onCallerAbort, { once: true });
      const timer = setTimeout(
        () => controller.abort(new AttemptTimeoutError(`attempt ${attempt} timed out`)),
        timerMs(Math.min(attemptTimeoutMs, remainingMs())),
      );
      let response: Response | undefined;
      let error: unknown;
      let retry: boolean;
      try {
        response = await fetchImpl(template.clone(), { signal: controller.signal });
        retry = retriable && (await isRetryableResponse(response));
      } catch (caught) {
        error = caught;
        // Aborted by our own timer rather than the caller: some runtimes reject with a plain AbortError.
        retry = retriable && (caught instanceof TypeError || (controller.signal.aborted && !signal?.aborted));
      } finally {
        clearTimeout(timer);
      }
      const outcome: AttemptOutcome = response
        ? { kind: 'response', status: response.status }
        : { kind: 'error', error };

      if (signal?.aborted || !retry) {
        onAttempt?.({ attempt, key, outcome, delayMs: null });
        if (signal?.aborted) throw signal.reason;
        // The caller's signal stays wired to the returned response so it can still abort the body.
        if (response) return response;
        signal?.removeEventListener('abort', onCallerAbort);
        throw error;
      }
      signal?.removeEventListener('abort', onCallerAbort);

      const retryAfterMs = parseRetryAfterMs(response?.headers.get('retry-after') ?? null);
      const delayMs = Math.round(
        retryAfterMs ?? Math.random() * Math.min(maxDelayMs, baseDelayMs * 2 ** Math.min(attempt - 1, 52)),
      );
      const budgetReason: BudgetReason | undefined =
        attempt >= maxAttempts
          ? 'attempts'
          : delayMs >= remainingMs()
            ? 'deadline'
            : retryAfterMs !== undefined && retryAfterMs > maxRetryAfterMs
              ? 'retryAfter'
              : undefined;
      if (budgetReason) {
        onAttempt?.({ attempt, key, outcome, delayMs: null });
        throw new RetryBudgetExceededError({
          reason: budgetReason,
          attempts: attempt,
          key,
          lastResponse: response,
          lastError: error,
        });
      }
      onAttempt?.({ attempt, key, outcome, delayMs });
      // Free the connection now; the body of a response we will not return is never read.
      await response?.body?.cancel().catch(() => {});
      await sleep(delayMs, signal);
    }
  };
}
