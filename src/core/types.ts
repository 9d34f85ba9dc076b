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
  /** Retention: how long after the claim the record (and its replay) lives. */
  ttlMs: number;
}

/**
 * The result of a claim. Expected outcomes are values, not exceptions.
 * - `acquired`: the caller owns the key and must `complete` or `release` it with `token`.
 * - `replay`: a completed record with the same fingerprint exists.
 * - `mismatch`: the key is held (in any state) by a request with another fingerprint.
 * - `in_progress`: another owner holds a live lease; `retryAfterMs` is the time left on it.
 */
export type ClaimResult =
  | { outcome: 'acquired'; token: string }
  | { outcome: 'replay'; response: StoredResponse }
  | { outcome: 'mismatch' }
  | { outcome: 'in_progress'; retryAfterMs: number };

/**
 * The contract every store implements and the conformance suite checks.
 *
 * Records whose retention has passed are treated as absent by every method, whether or not
 * `purgeExpired` has removed them yet. An in-progress record whose lease has passed may be
 * claimed again by a request with the same fingerprint (the new claim gets a new token).
 */
export interface IdempotencyStore {
  /** A short name for logs and errors: `memory`, `sqlite`, `postgres`, `redis`. */
  readonly name: string;
  /** Atomic: of many concurrent claims of one new key, across processes, exactly one is `acquired`. */
  claim(input: ClaimInput): Promise<ClaimResult>;
  /** Saves the response; `false` (and nothing written) when `token` no longer owns the record. */
  complete(scope: string, key: string, token: string, response: StoredResponse): Promise<boolean>;
  /** Deletes the in-progress record so a retry runs again; `false` when `token` no longer owns it. */
  release(scope: string, key: string, token: string): Promise<boolean>;
  /**
   * Resolves once the record is no longer in progress (completed, released, expired, lease passed)
   * or `timeoutMs` has passed, whichever comes first. Never rejects on timeout.
   */
  wait(scope: string, key: string, timeoutMs: number): Promise<void>;
  /**
   * Deletes records whose retention has passed, `batchSize` at a time, never one giant delete and
   * never a record whose lease is still live. Resolves with the number deleted.
   */
  purgeExpired(batchSize?: number): Promise<number>;
  /** Releases connections and timers the store opened itself. */
  close(): Promise<void>;
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

export function isAtomicStore(store: IdempotencyStore): store is AtomicStore {
  return typeof (store as Partial<AtomicStore>).atomic === 'function';
}
