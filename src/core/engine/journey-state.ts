import type {
  ClaimInput,
  FencedEvent,
  IdempotencyError,
  RejectedEvent,
  ReleasedEvent,
  SavedStep,
  StoredResponse,
  StoreErrorEvent,
  TransactionEndedError,
  WaitedEvent,
} from '../contract/index.js';
import type { CapturedResponse } from '../response/index.js';
import {
  circuitOpen,
  conflict,
  forAcceptEncoding,
  inProgress,
  replayUnreadable,
  toReplay,
} from '../response/index.js';
import type { IdempotencyContext, Outcome } from './adapter-contract.js';
import type { Engine } from './state.js';

// What one keyed request carries on its journey (journey.ts), and the events it reports.

/** A handler run as the engine drives it: the adapter's (or a job's) call of it, its response captured. */
export type Run<Tx> = (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>;

/**
 * Why a journey claims its key, which decides what owning it means (journey.ts, `interpret`): its
 * request's own claim runs the handler; a late answer's saves the response it already has; the
 * completer's takes an abandoned operation over.
 */
export type Errand = 'request' | 'late' | 'resume';

/** A refusal before any claim (a missing or invalid key, an oversized body, an unreadable saved request). */
export function rejected<Req>(
  { emit }: Engine<Req>,
  error: IdempotencyError,
  reason: RejectedEvent['reason'],
  scope?: string,
): Outcome {
  if (emit) emit({ type: 'rejected', reason, key: error.key, scope });
  return { kind: 'rejected', error };
}

/**
 * What one keyed request carries from its claim to its stored answer (journey.ts drives it): its
 * claim, the token it holds, its timings, how its replay is encoded, its steps. It builds every
 * event the request reports, so each names the request and its timings alike.
 */
export class Journey<Req = unknown, Tx = unknown> {
  errand: Errand = 'request';
  /** The owner token, once the key is acquired. */
  token = '';
  /** The operation's finished steps a takeover got back with the key. */
  finished: readonly SavedStep[] | undefined = undefined;
  /** The handler's response, once it answered, and as the store keeps it (a late answer saves it). */
  response: CapturedResponse | undefined = undefined;
  stored: StoredResponse | undefined = undefined;
  /** When the store call under way was made, and when the key was acquired (`performance.now()`). */
  calledMs = performance.now();
  acquiredMs = 0;
  /** Time in store calls (waits not included) and in the handler; kept for a listener only. */
  storeMs = 0;
  handlerMs = 0;
  /** Since when the key was found in progress, until the `waited` event that ends the wait. */
  waitingSinceMs: number | undefined = undefined;

  constructor(
    readonly engine: Engine<Req>,
    readonly claim: ClaimInput,
    readonly run: Run<Tx>,
    /** The client's `Accept-Encoding`, which a compressed replay is decoded for. */
    readonly acceptEncoding: string | undefined,
    /** The request saved with the operation's first step, for the completer. */
    readonly encodeRequest: (() => string) | undefined,
  ) {}

  /** The answer while another request owns the key: 409 + `Retry-After`. */
  busy(retryAfterMs: number): Outcome {
    return { kind: 'rejected', error: inProgress(this.claim.key, retryAfterMs) };
  }

  rejected(error: IdempotencyError, reason: RejectedEvent['reason']): Outcome {
    return rejected(this.engine, error, reason, this.claim.scope);
  }

  /** The refusal while the store's circuit is open; `undefined` when this request may ask the store. */
  refusal(): Outcome | undefined {
    const { breaker } = this.engine;
    const retryAfterMs = breaker?.refusal(this.calledMs);
    if (retryAfterMs === undefined) return undefined;
    return this.rejected(circuitOpen(this.claim.key, retryAfterMs, breaker!.failures), 'circuit_open');
  }

  /** Reports the failure of a store call (a throw or a timeout); answers `undefined`. */
  storeFailed(operation: StoreErrorEvent['operation'], error: unknown): undefined {
    const { config, emit, breaker } = this.engine;
    const { key, scope } = this.claim;
    if (emit) emit({ type: 'store_error', operation, key, scope, error });
    if (breaker?.failed(performance.now()) && emit) {
      emit({ type: 'circuit', state: 'open', store: config.store.name, failures: breaker.failures });
    }
    return undefined;
  }

  /** Notes a store call that answered, which closes an open circuit. */
  storeAnswered(): void {
    const { config, emit, breaker } = this.engine;
    if (breaker?.succeeded() && emit)
      emit({ type: 'circuit', state: 'closed', store: config.store.name, failures: 0 });
  }

  /** Ends a wait, if there was one, saying how. */
  waited(result: WaitedEvent['result']): void {
    const { emit } = this.engine;
    if (emit && this.waitingSinceMs !== undefined) {
      const { key, scope } = this.claim;
      emit({ type: 'waited', key, scope, waitedMs: performance.now() - this.waitingSinceMs, result });
      this.waitingSinceMs = undefined;
    }
  }

  /** The replay of `stored`, decoded when the client does not accept the coding it was stored in. */
  replay(stored: StoredResponse): Outcome | Promise<Outcome> {
    const { engine, claim } = this;
    let response: StoredResponse;
    try {
      response = toReplay(engine.config, stored, claim.key);
    } catch (cause) {
      return this.rejected(replayUnreadable(cause, claim.key), 'replay_unreadable');
    }
    const { emit } = engine;
    if (emit) {
      const { key, scope } = claim;
      emit({ type: 'replayed', key, scope, status: response.status, storeMs: this.storeMs });
    }
    // Only a compressed body can need this, so the common replay stays synchronous.
    if (response.headers['content-encoding'] === undefined) return { kind: 'replayed', response };
    return forAcceptEncoding(response, this.acceptEncoding).then((decoded) => ({
      kind: 'replayed',
      response: decoded,
    }));
  }

  conflict(): Outcome {
    const { config, emit } = this.engine;
    const { key, scope } = this.claim;
    if (emit) emit({ type: 'conflict', key, scope, storeMs: this.storeMs });
    return { kind: 'rejected', error: conflict(config, key) };
  }

  executed(status: number): void {
    const { emit } = this.engine;
    const { key, scope } = this.claim;
    if (emit)
      emit({ type: 'executed', key, scope, status, handlerMs: this.handlerMs, storeMs: this.storeMs });
  }

  released(reason: ReleasedEvent['reason'], status: number | undefined): void {
    const { emit } = this.engine;
    const { key, scope } = this.claim;
    if (emit)
      emit({
        type: 'released',
        key,
        scope,
        reason,
        status,
        handlerMs: this.handlerMs,
        storeMs: this.storeMs,
      });
  }

  /** Another request took the key over while this one ran: the work may have run twice. */
  fenced(step: FencedEvent['step']): void {
    const { emit } = this.engine;
    if (emit) emit({ type: 'fenced', key: this.claim.key, scope: this.claim.scope, step });
  }

  stepSaved(name: string, phase: boolean, stepMs: number): void {
    const { emit } = this.engine;
    if (emit) emit({ type: 'step_saved', key: this.claim.key, scope: this.claim.scope, name, phase, stepMs });
  }

  /** The completer took the operation over, `finishedSteps` of its steps done. */
  resumed(finishedSteps: number): void {
    const { emit } = this.engine;
    if (emit) emit({ type: 'resumed', key: this.claim.key, scope: this.claim.scope, finishedSteps });
  }

  gaveUp(resumes: number): void {
    const { emit } = this.engine;
    if (emit) emit({ type: 'gave_up', key: this.claim.key, scope: this.claim.scope, resumes });
  }

  transactionEnded(error: TransactionEndedError): void {
    const { emit } = this.engine;
    const { key, scope } = this.claim;
    if (emit) emit({ type: 'transaction_ended', key, scope, handlerMs: this.handlerMs, error });
  }

  stepReplayed(name: string): void {
    const { emit } = this.engine;
    if (emit) emit({ type: 'step_replayed', key: this.claim.key, scope: this.claim.scope, name });
  }
}
