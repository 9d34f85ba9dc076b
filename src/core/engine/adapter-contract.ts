import type { AbandonedRecord, IdempotencyError, StoredResponse } from '../contract/index.js';
import type { IncomingRequest } from '../request/index.js';
import type { CapturedResponse, ResponseCollector } from '../response/index.js';

// What an adapter and the engine exchange: the request in, the handler's response, the outcome out.

/** Handed to the handler of a guarded request. */
export interface IdempotencyContext<Tx = unknown> {
  key: string;
  scope: string;
  fingerprint: string;
  /** The open transaction in atomic mode (the store's client); `undefined` in lease mode. */
  tx: Tx | undefined;
  /** A key for a downstream provider derived from ours, so its retries are idempotent too. */
  downstreamKey(purpose: string): string;
  /**
   * Runs `fn` at most once per operation (lease mode): its JSON result is saved on the key's
   * record, fenced by the owner token, before `step` resolves with it. A retry (or the completer)
   * that takes the key over after a crash gets a finished step's saved result without running
   * `fn` and goes on at the first unfinished step. A step whose `fn` throws is not saved; the
   * key is then left for a retry that resumes at that step. Rejects with {@link StepFencedError}
   * when another request took the key over. A name already finished answers its saved result.
   * @example
   * const fine = await idem.step('recorded', () => insertFine(member, amount));
   * const charge = await idem.step('charged', () => provider.charge(fine, idem.stepKey('charged')));
   */
  step<T>(name: string, fn: () => T | Promise<T>): Promise<T>;
  /**
   * A SQL store's step whose work is in the store's own database: `fn`'s writes through `tx`,
   * the saved result and a lock on the key's record commit in one transaction, so the phase is
   * exactly-once even if the process dies inside it, and a dead owner's phase never commits after
   * its key was taken over. Needs a store with `phase` (SQLite, PostgreSQL, MySQL/MariaDB, an ORM's store).
   * @example
   * await idem.phase('paid', (db) => db.prepare('UPDATE fine SET status = ? WHERE id = ?').run('paid', id));
   */
  phase<T>(name: string, fn: (tx: Tx) => T | Promise<T>): Promise<T>;
  /** The provider's `Idempotency-Key` for step `name`: `downstreamKey('step:' + name)`. */
  stepKey(name: string): string;
}

/** The request saved with an operation's first step, as a completer re-drives it. */
export interface ResumedRequest {
  method: string;
  /** Path and query string. */
  path: string;
  contentType: string | undefined;
  /** The body the fingerprint was taken of (a parsed body: its JSON text). */
  body: Uint8Array;
  /** The `route` option of the engine that saved it. */
  route: string | undefined;
  scope: string;
  key: string;
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

/** The engine `createIdempotency` returns: what an adapter drives for each request. */
export interface Idempotency<Req = unknown, Tx = unknown> {
  readonly mode: 'lease' | 'atomic';
  /** The lower-case header the key is read from; `undefined` when the `key` option reads it. */
  readonly keyHeader: string | undefined;
  readonly maxBodyBytes: number;
  readonly maxResponseBytes: number;
  /**
   * Re-drives an abandoned record (`IdempotencyStore.abandoned`) from its saved request: claims it
   * with the normal fencing (only one of many completers acquires it) and, when acquired, runs
   * `run` as a handler of that request with its finished steps; the answer is saved as a
   * handler's would be. `undefined` when the saved request cannot be read (wrong `encryptionKey`)
   * or was saved under another `route` (nothing is claimed then).
   * Once `signal` aborts (the completer's `resumeTimeout`, or its `stop()`), the run counts as a
   * handler that threw: its lease is ended, its steps kept, whatever `run` still does.
   */
  resume(
    record: AbandonedRecord,
    run: (ctx: IdempotencyContext<Tx>, request: ResumedRequest) => Promise<CapturedResponse>,
    signal?: AbortSignal,
  ): Promise<Outcome | undefined>;
  /** Runs one request through the state machine; `run` invokes the handler and captures its response. */
  handle(
    request: IncomingRequest<Req>,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome>;
  /** The HTTP response for an engine error: `onError`'s, or JSON (`ietf`: problem+json). */
  render(error: IdempotencyError): StoredResponse;
  /**
   * Headers the adapter adds to the handler's fresh answer to a request keyed `key` (`echoKey`);
   * replays and rendered errors carry them already. Empty unless an option asks for some.
   */
  answerHeaders(key: string): Readonly<Record<string, string>>;
  /** The 413 error an adapter's `readBody` throws past `maxBodyBytes`; `handle` answers it. */
  bodyTooLarge(): IdempotencyError;
  /** A collector for one handler's response, which the adapter feeds as the response goes out. */
  collect(): ResponseCollector;
}
