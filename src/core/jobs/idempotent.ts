import type { AtomicStore, IdempotencyEventListener, IdempotencyStore } from '../contract/index.js';
import { ConfigError, ErrorCode, IdempotencyError } from '../contract/index.js';
import {
  claimInput,
  engineState,
  execute,
  type IdempotencyContext,
  type Prepared,
  rejected,
} from '../engine/index.js';
import type { Duration } from '../options/index.js';
import { checkOptions, MAX_KEY_LENGTH, optionNames, resolveOptions } from '../options/index.js';
import { plainCanonical, sha256, storableScope } from '../request/index.js';
import type { CapturedResponse, EncryptionKey } from '../response/index.js';
import { jsonProblem, LONE_SURROGATE } from './json-value.js';

/**
 * Options of {@link idempotent}. Durations are ms or strings like `'30s'`, `'7d'`.
 * @typeParam Input what `run` is given: a job, a message, a webhook event.
 * @typeParam Tx the transaction an atomic store hands work as `ctx.tx`, inferred from `store`.
 */
export interface IdempotentOptions<Input, Tx = unknown> {
  /**
   * Where records live, shared with HTTP routes or not: `memoryStore()`, `sqliteStore()`, … Required.
   * @example store: sqliteStore({ url: 'app.db', migrate: true })
   */
  store: IdempotencyStore | AtomicStore<Tx>;
  /**
   * Names the operation: the message id, the provider's event id. Required. Any string of 1 to
   * 1024 UTF-8 bytes without control characters, taken as it is.
   * @example key: (job) => job.id
   */
  key: (input: Input) => string;
  /**
   * The part of the input that must be the same for a later run of the key to replay (another
   * part with the same key is `key_conflict`), hashed as canonical JSON (RFC 8785). Pick the
   * payload out of a broker's message, whose delivery count changes between deliveries.
   * @default the whole input
   * @example fingerprint: (job) => job.data
   */
  fingerprint?: (input: Input) => unknown;
  /**
   * Whose key it is: the same key in two scopes names two operations. A string, or one per input.
   * @default 'idempotent'
   * @example scope: 'receipts'
   */
  scope?: string | ((input: Input) => string | Promise<string>);
  /**
   * `lease`: claim, work, save; a crash runs work again after the lease. `atomic` (SQL stores):
   * work's writes through `ctx.tx` commit in one transaction with the saved result.
   * @default 'lease'
   */
  mode?: 'lease' | 'atomic';
  /**
   * How long a key returns its saved result; after that it names a new operation.
   * @default '24h'
   */
  ttl?: Duration;
  /**
   * How long a claim lasts unless renewed: a running work renews it every third of this, a crashed
   * one frees the key within it.
   * @default '10s'
   */
  lease?: Duration;
  /**
   * `wait`: a concurrent run of a key in progress waits for its result; `reject`: it throws
   * `request_in_progress` at once.
   * @default 'wait'
   */
  concurrency?: 'wait' | 'reject';
  /**
   * How long a concurrent run waits before it throws `request_in_progress`.
   * @default '10s'
   */
  wait?: Duration;
  /**
   * Bound on a single store call; past it the run throws `store_unavailable` and work does not run.
   * @default '5s'
   */
  storeTimeout?: Duration;
  /**
   * The store's circuit breaker, as `createIdempotency`'s: after `failures` failed store calls in
   * a row, runs throw `store_unavailable` at once for `cooldown`. Shared with every route and job
   * on the same store object.
   * @default { failures: 5, cooldown: '1s' }
   */
  circuitBreaker?: { failures?: number; cooldown?: Duration } | false;
  /**
   * Largest result saved, in bytes of its JSON; a larger one throws `result_not_storable`.
   * @default 1_048_576 (1 MiB)
   */
  maxResultBytes?: number;
  /**
   * 32-byte key (or key ring) to encrypt saved results with AES-256-GCM, as `createIdempotency`'s.
   * @default undefined (results stored as JSON text)
   */
  encryptionKey?: EncryptionKey | readonly EncryptionKey[];
  /**
   * Hears the same events as an HTTP route's (`executed`, `replayed`, `conflict`, `waited`,
   * `released`, …); `retrysafe/otel`'s listener reports them.
   */
  onEvent?: IdempotencyEventListener;
}

/** The names `idempotent()` accepts, for the mutation guards that take its options. */
export const IDEMPOTENT_OPTION_NAMES = optionNames<IdempotentOptions<unknown>>({
  store: true,
  key: true,
  fingerprint: true,
  scope: true,
  mode: true,
  ttl: true,
  lease: true,
  concurrency: true,
  wait: true,
  storeTimeout: true,
  circuitBreaker: true,
  maxResultBytes: true,
  encryptionKey: true,
  onEvent: true,
});

/**
 * Runs `work` at most once per key and answers every run of the key with its result: the first
 * run's own, later runs' the saved JSON. A run while the key is in progress waits for it (or throws
 * `request_in_progress`); a run with another input throws `key_conflict`; when work throws, the
 * key is freed and the error rethrown, so the next delivery runs again.
 */
export type IdempotentRun<Input, Tx = unknown> = <Result>(
  input: Input,
  work: (ctx: IdempotencyContext<Tx>) => Result | Promise<Result>,
) => Promise<Result>;

/** The scope of runs whose options name none. */
const DEFAULT_SCOPE = 'idempotent';

// Fingerprints of runs live in their own domain: no HTTP request (method, path, body) hashes alike.
const FINGERPRINT_DOMAIN = '\0run\n';

// Control characters (C0, DEL, C1): a key is a name, and a NUL cannot be stored in PostgreSQL's text.
const CONTROL = /\p{Cc}/u;

function keyProblem(key: unknown): string | undefined {
  if (typeof key !== 'string') return `key(input) must return a string; got ${typeof key}`;
  if (key === '') return 'key(input) returned an empty string';
  if (CONTROL.test(key)) return 'key(input) returned a key with control characters';
  if (LONE_SURROGATE.test(key)) return 'key(input) returned a key with a lone surrogate';
  if (Buffer.byteLength(key) > MAX_KEY_LENGTH) {
    return `key(input) returned a key longer than ${MAX_KEY_LENGTH} UTF-8 bytes`;
  }
  return undefined;
}

const notStorable = (key: string, why: string) =>
  new IdempotencyError(
    500,
    ErrorCode.resultNotStorable,
    `idempotent(): work's result cannot be saved (${why}); the key was released, and in atomic mode work's writes were rolled back.`,
    {},
    key,
  );

/** The engine's error, its message in the terms of a run where HTTP's would mislead. */
function inRunTerms(error: IdempotencyError): IdempotencyError {
  const message = RUN_MESSAGES[error.code];
  if (message === undefined) return error;
  return new IdempotencyError(error.status, error.code, message, error.headers, error.key, {
    cause: error.cause,
  });
}

const RUN_MESSAGES: Partial<Record<ErrorCode, string>> = {
  [ErrorCode.keyConflict]: 'idempotent(): this key was already used with another input; work did not run.',
  [ErrorCode.inProgress]:
    'idempotent(): a run of this key is still in progress; work did not run. Deliver it again later.',
  [ErrorCode.storeUnavailable]:
    'idempotent(): the idempotency store is unavailable; work did not run. Deliver it again later.',
};

/**
 * Makes any async work idempotent, like a route: queue jobs, webhook events, cron runs. The
 * returned `run(input, work)` claims `key(input)` in `store` and runs `work(ctx)` at most once per
 * key (`ctx` as a handler's: `key`, `scope`, `tx` in atomic mode, `downstreamKey`), saving its JSON
 * result; every later run of the key returns that result without running work. Inputs and results
 * must be JSON (plain objects, arrays, strings, finite numbers, booleans, null, or an `undefined`
 * result); anything else throws `input_not_json` before work runs or `result_not_storable` after.
 * @example
 * const once = idempotent({ store, key: (job: Job) => job.id!, fingerprint: (job) => job.data });
 * new Worker('mail', (job) => once(job, () => sendMail(job.data)), { connection });
 */
export function idempotent<Input, Tx = unknown>(
  options: IdempotentOptions<Input, Tx>,
): IdempotentRun<Input, Tx> {
  const given = checkOptions('idempotent()', options, IDEMPOTENT_OPTION_NAMES);
  const { key: keyOf, fingerprint: partOf, scope = DEFAULT_SCOPE, maxResultBytes } = given;
  for (const [name, fn] of [
    ['key', keyOf],
    ['fingerprint', partOf],
  ] as const) {
    if ((name === 'key' || fn !== undefined) && typeof fn !== 'function') {
      throw new ConfigError(`retrysafe: idempotent() option \`${name}\` must be a function`);
    }
  }
  if (typeof scope !== 'string' && typeof scope !== 'function') {
    throw new ConfigError('retrysafe: idempotent() option `scope` must be a string or a function');
  }
  if (maxResultBytes !== undefined && (!Number.isSafeInteger(maxResultBytes) || maxResultBytes < 1)) {
    throw new ConfigError(
      `retrysafe: idempotent() option \`maxResultBytes\` must be a positive integer; got ${String(maxResultBytes)}`,
    );
  }
  const config = resolveOptions<Input, Tx>({
    store: given.store,
    mode: given.mode,
    ttl: given.ttl,
    lease: given.lease,
    wait: given.wait,
    concurrency: given.concurrency,
    storeTimeout: given.storeTimeout,
    circuitBreaker: given.circuitBreaker,
    encryptionKey: given.encryptionKey,
    onEvent: given.onEvent,
    maxResponseBytes: maxResultBytes,
    // Every result work returns is its answer, and there is no header to mark a replay with.
    storeStatus: () => true,
    replayedHeader: false,
  });
  const engine = engineState(config);
  const fixedScope = typeof scope === 'string' ? storableScope(scope) : undefined;

  /** The claim of `input`, or the refusal that answers it before the store is asked. */
  function prepare(input: Input): Prepared | Promise<Prepared> {
    const key = keyOf(input);
    const badKey = keyProblem(key);
    if (badKey !== undefined) {
      return rejected(engine, new IdempotencyError(400, ErrorCode.keyInvalid, badKey), 'key_invalid');
    }
    const part = partOf ? partOf(input) : input;
    const problem = jsonProblem(part);
    if (problem !== undefined) {
      const what = partOf ? 'fingerprint(input)' : 'the input (pick its JSON part with `fingerprint`)';
      const error = new IdempotencyError(
        400,
        ErrorCode.inputNotJson,
        `idempotent(): ${what} is not JSON: ${problem.replace('$', 'its value')}; work did not run.`,
        {},
        key,
      );
      return { kind: 'rejected', error };
    }
    const hash = sha256(`${FINGERPRINT_DOMAIN}${plainCanonical(part) ?? ''}`, 'hex');
    const prepared = (scope: string): Prepared => ({ claim: claimInput(engine, scope, key, hash) });
    if (fixedScope !== undefined) return prepared(fixedScope);
    const scoped = (scope as (input: Input) => string | Promise<string>)(input);
    return scoped instanceof Promise
      ? scoped.then((given) => prepared(storableScope(given)))
      : prepared(storableScope(scoped));
  }

  /** Work's result as the engine saves it: its JSON text, 204 and no body for `undefined`. */
  function captured(key: string, result: unknown): CapturedResponse {
    if (result === undefined) return { status: 204, headers: {}, body: new Uint8Array(0), complete: true };
    const problem = jsonProblem(result);
    if (problem !== undefined) throw notStorable(key, problem.replace('$', 'the result'));
    const body = Buffer.from(JSON.stringify(result));
    if (body.byteLength > config.maxResponseBytes) {
      throw notStorable(
        key,
        `${body.byteLength} bytes of JSON, over maxResultBytes ${config.maxResponseBytes}`,
      );
    }
    return { status: 200, headers: {}, body, complete: true };
  }

  return async function run<Result>(
    input: Input,
    work: (ctx: IdempotencyContext<Tx>) => Result | Promise<Result>,
  ): Promise<Result> {
    let result: Result | undefined;
    const outcome = await execute(
      engine,
      () => prepare(input),
      async (ctx: IdempotencyContext<Tx>) => {
        result = await work(ctx);
        return captured(ctx.key, result);
      },
    );
    if (outcome.kind === 'rejected') throw inRunTerms(outcome.error);
    if (outcome.kind !== 'replayed') return result as Result;
    const { status, body } = outcome.response;
    return (status === 204 ? undefined : JSON.parse(Buffer.from(body).toString())) as Result;
  };
}
