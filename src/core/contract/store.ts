/** What is kept of a response so it can be replayed byte for byte. */
export interface StoredResponse {
  status: number;
  /** Lower-case header names, only those on the replay allowlist. */
  headers: Record<string, string>;
  body: Uint8Array;
}

/** Everything a store needs to claim a key. */
export interface ClaimInput {
  /** The authenticated client; the same key from two scopes names two operations. */
  scope: string;
  key: string;
  /** Hex sha256 of method, route path and canonical body. */
  fingerprint: string;
  /** How long the claimer owns an in-progress record before a retry may take it over. */
  leaseMs: number;
  /**
   * Retention: how long after the claim the record (and its replay) lives. The engine passes its
   * `ttl`, which it never lets fall short of the lease (a record that expired while its owner still
   * ran would let a retry run the handler twice); a store keeps the record this long and derives
   * nothing.
   */
  retainMs: number;
  /**
   * How long the claim may take, waits on locks included (the engine passes `storeTimeout`): a
   * store that waits on locks gives up within it and fails the call. @default the store's own bounds
   */
  timeoutMs?: number;
  /**
   * Atomic mode: how long the claim may wait on a concurrent duplicate's open transaction before
   * answering `in_progress`; 0 answers at once. @default leaseMs
   */
  waitMs?: number;
}

/**
 * The result of a claim. Expected outcomes are values, not exceptions.
 * - `acquired`: the caller owns the key and must `complete` or `release` it with `token`.
 * - `replay`: a completed record with the same fingerprint exists.
 * - `mismatch`: the key is held (in any state) by a request with another fingerprint.
 * - `in_progress`: another owner holds a live lease; `retryAfterMs` is the time left on it.
 */
export type ClaimResult =
  | {
      outcome: 'acquired';
      token: string;
      /**
       * The operation's finished steps, in the order they were saved, when this claim took over a
       * record whose owner saved some and then died or gave up; absent (or empty) otherwise.
       */
      steps?: readonly SavedStep[];
    }
  | { outcome: 'replay'; response: StoredResponse }
  | { outcome: 'mismatch' }
  | { outcome: 'in_progress'; retryAfterMs: number };

/** A finished step as a store keeps it: its name and its result as the engine encoded it. */
export interface SavedStep {
  name: string;
  /** Opaque to the store: JSON text, or sealed with `encryptionKey` (base64). */
  value: string;
}

/**
 * An in-progress record whose lease has passed and that carries the request it was claimed for
 * (saved with its first step), so that a completer can re-drive it: `Idempotency.resume`.
 */
export interface AbandonedRecord {
  scope: string;
  key: string;
  fingerprint: string;
  /** The saved request, as the engine encoded it (opaque to the store). */
  request: string;
  leaseUntilMs: number;
}

/** What `IdempotencyStore.abandoned` is asked for. */
export interface AbandonedOptions {
  /**
   * The most records returned, 1 to {@link MAX_LIST_LIMIT}.
   * @default 100
   */
  limit?: number;
}

/** The most records one `list` page may hold. */
export const MAX_LIST_LIMIT = 1000;

/** What `IdempotencyStore.list` is asked for. */
export interface ListKeysOptions {
  /** The `next` of the previous page (an opaque string); absent for the first page. */
  after?: string;
  /**
   * The most records on this page, 1 to {@link MAX_LIST_LIMIT}.
   * @default 100
   */
  limit?: number;
  /** Only this scope's records. */
  scope?: string;
}

/**
 * A record as the admin API lists it: never its fingerprint or owner token, and its saved response
 * only when `get` is asked for it ({@link GetKeyOptions}).
 */
export interface KeyRecordSummary {
  scope: string;
  key: string;
  state: 'in_progress' | 'completed';
  /** The saved response's status; `null` while in progress. */
  status: number | null;
  createdAtMs: number;
  /** When retention passes and the key names a new operation. */
  expiresAtMs: number;
  /**
   * The owner's lease deadline while in progress (in the past once the lease has passed and a
   * retry may take the key over); `null` once completed.
   */
  leaseUntilMs: number | null;
  /** The names of the operation's finished steps, in the order they were saved; absent when none. */
  steps?: string[];
}

/** What `IdempotencyStore.get` is asked for. */
export interface GetKeyOptions {
  /**
   * Also read a completed record's saved response: status, headers and body as stored (sealed
   * when the engine's `encryptionKey` sealed it; `openStoredBody` opens it).
   * @default false
   */
  response?: boolean;
}

/** A record as `get` shows it: its summary and, when asked for and completed, its saved response. */
export interface KeyRecord extends KeyRecordSummary {
  /** The saved response, as stored; present only with `{ response: true }` on a completed record. */
  response?: StoredResponse;
}

/** One page of `IdempotencyStore.list`. */
export interface KeyPage {
  records: KeyRecordSummary[];
  /** Pass as `after` for the next page; `null` when the listing is complete. */
  next: string | null;
}

/**
 * The contract every store implements and the conformance suite checks: the request path, steps
 * and administration, each a capability of its own ({@link RequestStore}, {@link StepStore},
 * {@link AdminStore}).
 *
 * Records whose retention has passed are treated as absent by every method, whether or not
 * `purgeExpired` has removed them yet. An in-progress record whose lease has passed may be
 * claimed again by a request with the same fingerprint (the new claim gets a new token).
 */
export interface IdempotencyStore extends RequestStore, StepStore, AdminStore {}

/** The request path: what every guarded request asks of a store. */
export interface RequestStore {
  /** A short name for logs and errors: `memory`, `sqlite`, `postgres`, `redis`. */
  readonly name: string;
  /** Atomic: of many concurrent claims of one new key, across processes, exactly one is `acquired`. */
  claim(input: ClaimInput): Promise<ClaimResult>;
  /** Saves the response; `false` (and nothing written) when `token` no longer owns the record. */
  complete(scope: string, key: string, token: string, response: StoredResponse): Promise<boolean>;
  /** Deletes the in-progress record so a retry runs again; `false` when `token` no longer owns it. */
  release(scope: string, key: string, token: string): Promise<boolean>;
  renew(scope: string, key: string, token: string, leaseMs: number): Promise<boolean>;
  wait(scope: string, key: string, timeoutMs: number): Promise<void>;
  /** Releases connections and timers the store opened itself. */
  close(): Promise<void>;
}

/** Steps: multi-step operations that survive a crash, and the completer that finishes them. */
export interface StepStore {
  saveStep(scope: string, key: string, token: string, step: SavedStep, request?: string): Promise<boolean>;
  abandoned(options?: AbandonedOptions): Promise<AbandonedRecord[]>;
}

/** Administration: what operators and retention ask of a store. */
export interface AdminStore {
  purgeExpired(batchSize?: number): Promise<number>;
  list(options?: ListKeysOptions): Promise<KeyPage>;
  get(scope: string, key: string, options?: GetKeyOptions): Promise<KeyRecord | undefined>;
  delete(scope: string, key: string): Promise<boolean>;
}

/** What an atomic unit of work returns: the response, and whether to commit it. */
export interface AtomicWorkResult {
  response: StoredResponse;
  /** `false` rolls back the handler's writes and the claim together (5xx, not storable). */
  commit: boolean;
}

/** The outcome of `AtomicStore.atomic`: either the claim did not acquire, or the work ran. */
export type AtomicResult =
  | Exclude<ClaimResult, { outcome: 'acquired' }>
  | { outcome: 'executed'; response: StoredResponse; committed: boolean };

/**
 * A store that can run the claim, the handler's own writes (through `tx`) and the saved response
 * in one database transaction: a crash at any point leaves all of it or none of it.
 */
export interface AtomicStore<Tx = unknown> extends IdempotencyStore {
  atomic(input: ClaimInput, work: (tx: Tx) => Promise<AtomicWorkResult>): Promise<AtomicResult>;
}

/**
 * A SQL store that runs a step's own writes (through `tx`), the step's saved result and a lock on
 * the key's record in one transaction: `IdempotencyContext.phase`.
 */
export interface PhaseStore<Tx = unknown> extends IdempotencyStore {
  /**
   * Locks the record of `(scope, key)` (a takeover waits for the lock), checks that `token` still
   * owns it in progress, runs `work(tx)` and saves its step (`work`'s answer) in the same
   * transaction. `false` (rolled back, `work` not run) when `token` no longer owns the record; a
   * throw from `work` rolls back and is rethrown.
   */
  phase(
    scope: string,
    key: string,
    token: string,
    work: (tx: Tx) => Promise<SavedStep>,
    request?: string,
  ): Promise<boolean>;
}

/** Whether `store` offers `phase`, which `IdempotencyContext.phase` needs. */
export function isPhaseStore(store: IdempotencyStore): store is PhaseStore {
  return typeof (store as Partial<PhaseStore>).phase === 'function';
}

/** Whether `store` offers `atomic`, which `mode: 'atomic'` needs. */
export function isAtomicStore(store: IdempotencyStore): store is AtomicStore {
  return typeof (store as Partial<AtomicStore>).atomic === 'function';
}

/**
 * What a project declares once so that the request types of Express (`req.idempotency`), Fastify
 * (`request.idempotency`) and Hono (`c.get('idempotency')` after `app.use`) know its transaction
 * type. Those are global declarations of the frameworks, which no factory's `Tx` can reach; a
 * Hono route naming the middleware, node:http handlers, Koa's state and Nest's interceptor get
 * `Tx` from the store instead.
 * @example
 * import type { PoolClient } from 'pg';
 * declare module 'retrysafe' {
 *   interface Register {
 *     tx: PoolClient;
 *   }
 * }
 */
// biome-ignore lint/suspicious/noEmptyInterface: filled in by the project's module augmentation.
export interface Register {}

/** The `tx` a project declared in {@link Register}, else `unknown`. */
export type RegisteredTx = Register extends { tx: infer Tx } ? Tx : unknown;
