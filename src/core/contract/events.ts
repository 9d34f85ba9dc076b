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
  step: 'complete' | 'release';
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
  operation: 'claim' | 'complete' | 'release' | 'wait' | 'renew' | 'atomic';
  /** What the store threw (or the timeout error). */
  error: unknown;
}

/**
 * The request was refused before the store was asked: `key_missing` (a `required` route),
 * `key_invalid`, `body_too_large`; or its saved response could not be read (`replay_unreadable`,
 * an `encryptionKey` that does not open it).
 */
export interface RejectedEvent {
  type: 'rejected';
  reason: 'key_missing' | 'key_invalid' | 'body_too_large' | 'replay_unreadable';
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
  | LeaseRenewedEvent
  | LeaseLostEvent
  | StoreErrorEvent
  | RejectedEvent;

/** The `type` of an {@link IdempotencyEvent}: `'executed'`, `'replayed'`, `'conflict'`, … */
export type IdempotencyEventType = IdempotencyEvent['type'];

/**
 * What an event is counted by besides its type, for metrics: why it was released or rejected
 * (`reason`), how a wait ended (`result`), which store call failed (`operation`), which step was
 * fenced (`step`); `undefined` for the other types.
 * @example
 * onEvent: (event) => outcomes.inc({ outcome: event.type, reason: eventDetail(event)?.value ?? '' })
 */
export function eventDetail(
  event: IdempotencyEvent,
): { name: 'reason' | 'result' | 'operation' | 'step'; value: string } | undefined {
  switch (event.type) {
    case 'released':
    case 'rejected':
      return { name: 'reason', value: event.reason };
    case 'waited':
      return { name: 'result', value: event.result };
    case 'store_error':
      return { name: 'operation', value: event.operation };
    case 'fenced':
      return { name: 'step', value: event.step };
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
