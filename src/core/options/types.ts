import type {
  AtomicStore,
  IdempotencyError,
  IdempotencyEventListener,
  IdempotencyStore,
  StoredResponse,
} from '../contract/index.js';
import type { FingerprintBody } from '../request/index.js';
import type { EncryptionKey } from '../response/index.js';
import type { Duration } from './duration.js';
import { optionNames } from './validate.js';

/**
 * The documentation `profile: 'ietf'` links its errors to when `docsUrl` is not given: the draft's
 * section on error scenarios, which says what each of its statuses means.
 */
export const IETF_DRAFT_ERRORS_URL =
  'https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header#section-2.7';

/** The header a replay carries by default (`replayedHeader`). */
export const REPLAYED_HEADER = 'idempotency-replayed';

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
 * @typeParam Tx the transaction an atomic store hands the handler, inferred from `store`.
 */
export interface IdempotencyOptions<Req = unknown, Tx = unknown> {
  /**
   * Where records live: `memoryStore()`, `sqliteStore()`, `postgresStore()`, `redisStore()`.
   * Required; it has no default.
   * @example store: sqliteStore({ url: 'app.db', migrate: true })
   */
  store: IdempotencyStore | AtomicStore<Tx>;
  /**
   * `lease`: claim, run, save — at most one concurrent execution; a crash re-runs after the lease.
   * `atomic`: claim, the handler's own writes (through `ctx.tx`) and the saved response commit in
   * one database transaction (SQL stores only) — exactly once for writes in that database.
   * @default 'lease'
   * @example mode: 'atomic'
   */
  mode?: 'lease' | 'atomic';
  /**
   * Answer 400 when a guarded request has no key.
   * @default false
   * @example required: true
   */
  required?: boolean;
  /**
   * The request header that carries the key.
   * @default 'Idempotency-Key'
   * @example headerName: 'X-Idempotency-Key'
   */
  headerName?: string;
  /**
   * Where a request's key comes from, instead of the `headerName` header: a value checked as the
   * header's would be, or `undefined` for no key.
   * @default undefined (the `headerName` header)
   * @example key: (req) => new URL(req.url, 'http://x').searchParams.get('key') ?? undefined
   */
  key?: (req: Req) => string | undefined | Promise<string | undefined>;
  /**
   * Methods guarded by keys; the others pass through untouched.
   * @default ['POST', 'PATCH']
   * @example methods: ['POST', 'PATCH', 'PUT']
   */
  methods?: readonly string[];
  /**
   * Retention: how long a key replays its response; after that it names a new operation.
   * @default '24h'
   * @example ttl: '7d'
   */
  ttl?: Duration;
  /**
   * How long a claim lasts unless renewed. A running handler renews its claim every third of the
   * lease, so this bounds how long a crashed process keeps a key (a retry then runs again), not
   * how long a handler may take. At 10 s a renewal goes out every 3.3 s, so one that fails or
   * stalls is followed by two more before the claim runs out, while a crash holds the key for
   * 10 s at most. Never longer than `ttl`: a longer one is shortened to it.
   * @default '10s'
   * @example lease: '30s'
   */
  lease?: Duration;
  /**
   * `wait`: a duplicate of an in-progress request waits for it; `reject`: 409 (with `Retry-After`)
   * at once, as the IETF draft recommends (§2.7).
   * @default 'wait'; `'reject'` with `profile: 'ietf'`
   * @example concurrency: 'reject'
   */
  concurrency?: 'wait' | 'reject';
  /**
   * How long a duplicate waits for the in-progress original before 409 + Retry-After.
   * @default '10s'
   * @example wait: 2_000
   */
  wait?: Duration;
  /**
   * `default`: mismatch is 409 with JSON errors; `ietf`: the draft's recommendations — mismatch is
   * 422, errors are problem+json linking `docsUrl` (by default the draft's §2.7), and a duplicate
   * of an in-progress request is 409 at once (`concurrency: 'reject'` unless set).
   * @default 'default'
   * @example profile: 'ietf'
   */
  profile?: 'default' | 'ietf';
  /**
   * An absolute URL documenting your idempotency contract (key format, retention, errors). Every
   * error retrysafe renders links it with `Link: <url>; rel="describedby"`, and problem+json
   * bodies (`profile: 'ietf'`) carry it as their `type`, as the IETF draft's examples do.
   * @default undefined; with `profile: 'ietf'`, {@link IETF_DRAFT_ERRORS_URL}
   * @example docsUrl: 'https://developer.example.com/idempotency'
   */
  docsUrl?: string;
  /**
   * The authenticated client; the same key from two scopes names two operations. A scope past
   * 1024 UTF-8 bytes is stored as a digest of it (`sha256-scope:…`), so every store indexes it.
   * @default a digest of the `Authorization` header (`credentialScope`); `''` for requests without one
   * @example scope: (req) => req.headers['x-api-key-id'] ?? ''
   */
  scope?: (req: Req) => string | Promise<string>;
  /**
   * The deployment secret (at least 16 bytes, the same on every server sharing the store) that keys
   * the default scope: `credentialScope(authorization, scopeSecret)`, an HMAC that cannot be
   * guessed back from the store. Without it the default scope is a plain sha256 of
   * `Authorization`, and a weak Basic password can be guessed back offline. Changing it changes
   * every scope: keys taken before stop replaying (they expire with their `ttl`).
   * @default undefined (a plain sha256)
   * @example scopeSecret: process.env.SCOPE_SECRET
   */
  scopeSecret?: string | Uint8Array;
  /**
   * Maps a parsed JSON body before fingerprinting, so fields that legitimately differ between
   * retries do not make a retry a mismatch.
   * @default undefined (the whole canonical body)
   * @example fingerprintBody: ({ sentAt, ...rest }) => rest
   */
  fingerprintBody?: FingerprintBody;
  /**
   * Extra response headers to store and replay, besides the defaults.
   * @default []
   * @example replayHeaders: ['x-request-cost']
   */
  replayHeaders?: readonly string[];
  /**
   * The header that marks a replayed answer (`true`), or `false` to send none. APIs that imitate
   * Stripe's answer `Idempotent-Replayed`.
   * @default 'Idempotency-Replayed'
   * @example replayedHeader: 'Idempotent-Replayed'
   */
  replayedHeader?: string | false;
  /**
   * Sends the request's key back on every answer to a keyed request (fresh, replayed, or an
   * error), in the key header (`headerName`): stripe-node reads it into `lastResponse`. Bare when
   * the key allows it (`OD-7f21`), else (and always with `profile: 'ietf'`) a quoted sf-string.
   * @default false
   * @example echoKey: true
   */
  echoKey?: boolean;
  /**
   * Which statuses are saved; the others release the key, so a retry runs again. By default
   * 5xx are released (the retry may succeed), and so are 400, 413, 415, 422 and 429: the request
   * was never accepted, and the corrected one may reuse the key. Compose with `defaultStoreStatus`.
   * @default defaultStoreStatus: status < 500, except 400, 413, 415, 422, 429
   * @example storeStatus: (status) => defaultStoreStatus(status) && status !== 409
   */
  storeStatus?: (status: number) => boolean;
  /**
   * Shortest key accepted.
   * @default 1
   * @example minKeyLength: 16
   */
  minKeyLength?: number;
  /**
   * Longest key accepted; at most 1024, the longest every store indexes (a ConfigError above).
   * @default 255
   * @example maxKeyLength: 64
   */
  maxKeyLength?: number;
  /**
   * Largest request body read, in bytes (413 beyond).
   * @default 1_048_576 (1 MiB)
   * @example maxBodyBytes: 64 * 1024
   */
  maxBodyBytes?: number;
  /**
   * Largest response kept for replay, in bytes.
   * @default 1_048_576 (1 MiB)
   * @example maxResponseBytes: 256 * 1024
   */
  maxResponseBytes?: number;
  /**
   * Largest step result (`idem.step`, `idem.phase`) saved, in bytes of its JSON text. A larger
   * one fails the step before anything is saved: every claim of the key reads its steps back.
   * @default 65_536 (64 KiB)
   * @example maxStepBytes: 1024 * 1024
   */
  maxStepBytes?: number;
  /**
   * How many times the completer (`resume`) may take an operation over before it gives up: the
   * next resume then saves a final answer instead of running the handler (500
   * `operation_abandoned`, replayed to every retry) and emits `gave_up`. Each resume is counted on
   * the record (a step named `retrysafe:resume:N`), so every process agrees.
   * @default 20
   * @example maxResumes: 50
   */
  maxResumes?: number;
  /**
   * Names the handler these options guard, for the completer: saved with each operation's request
   * (with its first step), and `resume` re-drives only operations saved under the same name, so
   * one route's completer never finishes another route's operation with its own handler. Give
   * each guarded handler with steps on a shared store a name of its own (one `idempotency()` per
   * route). Without it, records are saved with no name and resumed only by engines without one.
   * @default undefined
   * @example route: 'POST /charges'
   */
  route?: string;
  /**
   * Bound on a single store call, so a stuck database answers 503 instead of hanging.
   * @default '5s'
   * @example storeTimeout: '2s'
   */
  storeTimeout?: Duration;
  /**
   * A circuit breaker in front of the store: once `failures` store calls in a row have failed
   * (thrown, or outlived `storeTimeout`), requests are refused at once with 503 `store_unavailable`
   * and `Retry-After` for `cooldown`, instead of each waiting out its own store timeout; then one
   * request per `cooldown` tries the store, and the first that succeeds closes the circuit. Every
   * route and job on one store object shares one breaker per setting. `false` turns it off.
   * Transitions are `circuit` events; each refusal a `rejected` event (reason `circuit_open`).
   * @default { failures: 5, cooldown: '1s' }
   * @example circuitBreaker: { failures: 10, cooldown: '5s' }
   */
  circuitBreaker?: { failures?: number; cooldown?: Duration } | false;
  /**
   * 32-byte key (Uint8Array or base64) to encrypt stored bodies with AES-256-GCM, or a key ring
   * `[current, ...previous]`: bodies are encrypted with the first and decrypted with any, so
   * records written before a rotation still replay. Drop a previous key once `ttl` has passed.
   * @default undefined (bodies stored as sent)
   * @example encryptionKey: [process.env.IDEMPOTENCY_KEY, process.env.IDEMPOTENCY_KEY_PREVIOUS]
   */
  encryptionKey?: EncryptionKey | readonly EncryptionKey[];
  /**
   * Renders engine errors; return `undefined` to keep the default JSON rendering.
   * @default undefined (JSON; `profile: 'ietf'`: problem+json)
   * @example onError: (error) => ({ status: error.status, headers: {}, body: Buffer.from(error.code) })
   */
  onError?: (error: IdempotencyError) => StoredResponse | undefined;
  /**
   * Hears one {@link IdempotencyEvent} per moment of a guarded request: `executed`, `replayed`,
   * `conflict`, `waited`, `released`, `fenced`, `lease_renewed`, `lease_lost`, `store_error`,
   * `rejected`, with durations in ms. Called synchronously; a listener that throws (or rejects) is
   * reported once as a process warning and never changes an answer. Without one, no event is
   * built and nothing is timed. `retrysafe/otel` provides one for OpenTelemetry.
   * @example
   * onEvent: (event) => { if (event.type === 'store_error') log.error(event.error) }
   */
  onEvent?: IdempotencyEventListener;
}

/** Every option `createIdempotency` knows; adapters add their own to this list. */
export const ENGINE_OPTION_NAMES = optionNames<IdempotencyOptions>({
  store: true,
  mode: true,
  required: true,
  headerName: true,
  key: true,
  methods: true,
  ttl: true,
  lease: true,
  concurrency: true,
  wait: true,
  profile: true,
  docsUrl: true,
  scope: true,
  scopeSecret: true,
  fingerprintBody: true,
  replayHeaders: true,
  replayedHeader: true,
  echoKey: true,
  storeStatus: true,
  minKeyLength: true,
  maxKeyLength: true,
  maxBodyBytes: true,
  maxResponseBytes: true,
  maxStepBytes: true,
  route: true,
  maxResumes: true,
  storeTimeout: true,
  circuitBreaker: true,
  encryptionKey: true,
  onError: true,
  onEvent: true,
});
