/** Fields every event of one request carries. */
interface RequestEvent {
  /** The request's `Idempotency-Key`. */
  key: string;
  /** The scope the key lives in (by default a digest of the `Authorization` value, never the value). */
  scope: string;
}

/**
 * The handler ran and its response was saved: retries with this key replay it. A save that failed
 * is reported as a `store_error` (`complete`) just before; the response is sent all the same, and
 * the key stays in progress until its lease passes.
 */
export interface ExecutedEvent extends RequestEvent {
  type: 'executed';
  status: number;
  /** Time the handler took. */
  handlerMs: number;
  /** Time this request spent in store calls (claims and the save; waits not included). */
  storeMs: number;
}

/**
 * The handler ran (or threw) and its key was freed, so a retry runs again.
 * - `handler_threw`: the handler threw or rejected.
 * - `not_stored`: `storeStatus` refused the status (by default 5xx, and 400, 413, 415, 422, 429:
 *   answers to requests that were never accepted).
 * - `response_too_large`: the response outgrew `maxResponseBytes`.
 */
export interface ReleasedEvent extends RequestEvent {
  type: 'released';
  reason: 'handler_threw' | 'not_stored' | 'response_too_large';
  /** The handler's status; absent when it threw. */
  status?: number;
  handlerMs: number;
  storeMs: number;
}

/** A retry was answered with the saved response; the handler did not run. */
export interface ReplayedEvent extends RequestEvent {
  type: 'replayed';
  status: number;
  storeMs: number;
}

/** The key was already used with a different request (method, path or body): 409 (`ietf`: 422). */
export interface ConflictEvent extends RequestEvent {
  type: 'conflict';
  storeMs: number;
}

/**
 * The key was in progress under another request. `result` says how the waiting ended:
 * `replayed` (the original finished), `acquired` (it was released; this request runs the handler),
 * `conflict`, `in_progress` (gave up: 409 + Retry-After; at once with `concurrency: 'reject'`), or
 * `store_error`. A `replayed`, `executed`, … event of the request follows as usual.
 */
export interface WaitedEvent extends RequestEvent {
  type: 'waited';
  waitedMs: number;
  result: 'replayed' | 'acquired' | 'conflict' | 'in_progress' | 'store_error';
}

/**
 * A handler finished after its lease was lost (another request took the key over), so its
 * `step` was refused by the store: the work may have run twice.
 */
export interface FencedEvent extends RequestEvent {
  type: 'fenced';
  /** The store call refused: `step` is a step's save (`ctx.step` or `ctx.phase`). */
  step: 'complete' | 'release' | 'step';
}

/** A step finished and its result was saved on the record (`ctx.step`, or `ctx.phase` with `phase: true`). */
export interface StepSavedEvent extends RequestEvent {
  type: 'step_saved';
  /** The step's name. */
  name: string;
  /** Whether it ran as a phase: its writes committed with the saved result. */
  phase: boolean;
  /** Time the step took, its work and its save. */
  stepMs: number;
}

/** A step had finished before (this operation was taken over): its saved result answered, `fn` not run. */
export interface StepReplayedEvent extends RequestEvent {
  type: 'step_replayed';
  name: string;
}

/**
 * A completer took over an abandoned operation to finish it from its saved request; the
 * `executed` (or `released`) event of the re-driven handler follows.
 */
export interface ResumedEvent extends RequestEvent {
  type: 'resumed';
  /** How many of its steps had finished before. */
  finishedSteps: number;
}

/**
 * The completer gave up on an operation after `maxResumes` takeovers: a final answer (500
 * `operation_abandoned`) was saved instead of running its handler again, and every retry replays it.
 * Its finished steps' effects stay (a charge made is not undone): look the key up and settle by hand.
 */
export interface GaveUpEvent extends RequestEvent {
  type: 'gave_up';
  /** How many times it had been resumed. */
  resumes: number;
}

/** A running handler's lease was renewed. */
export interface LeaseRenewedEvent extends RequestEvent {
  type: 'lease_renewed';
}

/** A renewal found the lease taken over by another request; it is renewed no more. */
export interface LeaseLostEvent extends RequestEvent {
  type: 'lease_lost';
}

/**
 * A store call failed or did not answer within `storeTimeout`. A failed `claim`, `wait` or
 * `atomic` answered 503; a failed `complete`, `release` or `renew` did not change the answer.
 */
export interface StoreErrorEvent extends RequestEvent {
  type: 'store_error';
  operation: 'claim' | 'complete' | 'release' | 'wait' | 'renew' | 'atomic' | 'step';
  /** What the store threw (or the timeout error). */
  error: unknown;
}

/**
 * The store's circuit breaker opened (`failures` store calls in a row failed: requests are refused
 * with 503 for `cooldownMs`, one probe per cooldown) or closed again (a store call succeeded).
 */
export interface CircuitEvent {
  type: 'circuit';
  state: 'open' | 'closed';
  /** The store's name (`postgres`, `redis`, …). */
  store: string;
  /** Failed calls in a row that opened it; 0 on closing. */
  failures: number;
}

/**
 * Atomic mode: the handler ended the operation's transaction itself (a `COMMIT` of its own, an ORM
 * transaction on a new wrapper of `ctx.tx`), so its writes may be committed without the answer. The
 * request answered 500 and the key keeps that answer: no retry runs the writes again.
 */
export interface TransactionEndedEvent extends RequestEvent {
  type: 'transaction_ended';
  handlerMs: number;
  /** The store's message, naming the cause and the fix. */
  error: unknown;
}

/**
 * The request was refused before the store was asked: `key_missing` (a `required` route),
 * `key_invalid`, `body_too_large`, `circuit_open` (the store's circuit breaker is open: 503); or its saved response could not be read (`replay_unreadable`,
 * an `encryptionKey` that does not open it).
 */
export interface RejectedEvent {
  type: 'rejected';
  reason: 'key_missing' | 'key_invalid' | 'body_too_large' | 'circuit_open' | 'replay_unreadable';
  /** The key, when the request carried a well-formed one. */
  key?: string;
  scope?: string;
}

/** What the engine reports to `onEvent`: one event per moment of a guarded request. */
export type IdempotencyEvent =
  | ExecutedEvent
  | ReleasedEvent
  | ReplayedEvent
  | ConflictEvent
  | WaitedEvent
  | FencedEvent
  | StepSavedEvent
  | StepReplayedEvent
  | ResumedEvent
  | GaveUpEvent
  | LeaseRenewedEvent
  | LeaseLostEvent
  | StoreErrorEvent
  | CircuitEvent
  | TransactionEndedEvent
  | RejectedEvent;

/** The `type` of an {@link IdempotencyEvent}: `'executed'`, `'replayed'`, `'conflict'`, … */
export type IdempotencyEventType = IdempotencyEvent['type'];

/**
 * What an event is counted by besides its type, for metrics: why it was released or rejected
 * (`reason`), how a wait ended (`result`), which store call failed (`operation`), which call was
 * fenced or which step was saved or replayed (`step`), where a store's circuit went (`state`);
 * `undefined` for the other types.
 * @example
 * onEvent: (event) => outcomes.inc({ outcome: event.type, reason: eventDetail(event)?.value ?? '' })
 */
export function eventDetail(
  event: IdempotencyEvent,
): { name: 'reason' | 'result' | 'operation' | 'step' | 'state'; value: string } | undefined {
  switch (event.type) {
    case 'released':
    case 'rejected':
      return { name: 'reason', value: event.reason };
    case 'waited':
      return { name: 'result', value: event.result };
    case 'store_error':
      return { name: 'operation', value: event.operation };
    case 'circuit':
      return { name: 'state', value: event.state };
    case 'fenced':
      return { name: 'step', value: event.step };
    case 'step_saved':
    case 'step_replayed':
      return { name: 'step', value: event.name };
    default:
      return undefined;
  }
}

/** The option `onEvent` takes. */
export type IdempotencyEventListener = (event: IdempotencyEvent) => void;

/**
 * Wraps a listener so that nothing it does reaches the request: a throw, or a rejected promise
 * from an async listener, is reported once as a process warning and otherwise ignored.
 */
export function safeListener(listener: IdempotencyEventListener): IdempotencyEventListener {
  let warned = false;
  const report = (error: unknown) => {
    if (warned) return;
    warned = true;
    process.emitWarning(
      `retrysafe: the onEvent listener failed (further failures are not reported): ${error instanceof Error ? error.message : String(error)}`,
      { code: 'RETRYSAFE_ON_EVENT' },
    );
  };
  return function onEvent(event) {
    try {
      const returned: unknown = listener(event);
      if (returned instanceof Promise) returned.catch(report);
    } catch (error) {
      report(error);
    }
  };
}
