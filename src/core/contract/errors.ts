/** Machine-readable codes of the errors the engine answers with. */
export const ErrorCode = {
  keyMissing: 'idempotency_key_missing',
  keyInvalid: 'idempotency_key_invalid',
  keyConflict: 'key_conflict',
  inProgress: 'request_in_progress',
  storeUnavailable: 'store_unavailable',
  bodyTooLarge: 'body_too_large',
  responseTooLarge: 'response_too_large',
  replayUnreadable: 'replay_unreadable',
  /** `idempotent`: the input (or its `fingerprint` part) is not JSON; work did not run. */
  inputNotJson: 'input_not_json',
  /** `idempotent`: work's result is not JSON or outgrew `maxResultBytes`; nothing was saved. */
  resultNotStorable: 'result_not_storable',
  /** An operation with steps the completer gave up on after `maxResumes`: its final, saved answer. */
  operationAbandoned: 'operation_abandoned',
  /** Atomic mode: the handler ended the operation's transaction itself; the key is not run again. */
  transactionEnded: 'transaction_ended',
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/**
 * Base class of every error retrysafe throws or renders: `ConfigError` for a bad option,
 * `IdempotencyError` for an outcome answered over HTTP, and the few runtime errors of stores and
 * the client (`MemoryStoreFullError`, `RetryBudgetExceededError`). Recognisable by `name` across
 * package copies.
 */
export class RetrysafeError extends Error {
  override name = 'RetrysafeError';
}

/**
 * A bad option, thrown at construction with the option's name in the message (unknown names come
 * with the nearest known one); the client also throws it for a call's own bad options.
 */
export class ConfigError extends RetrysafeError {
  override name = 'ConfigError';
}

/**
 * An outcome the engine answers with an HTTP error: bad key, conflict, in progress, store down.
 * Adapters render it through their framework's error path; `onError` may change the rendering.
 */
export class IdempotencyError extends RetrysafeError {
  override name = 'IdempotencyError';
  constructor(
    readonly status: number,
    readonly code: ErrorCode,
    message: string,
    /** Extra response headers, e.g. `retry-after`. */
    readonly headers: Record<string, string> = {},
    /** The key the request carried, when it had a well-formed one. */
    readonly key?: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /** The HTTP status under the name frameworks look for (Express, Fastify). */
  get statusCode(): number {
    return this.status;
  }
}

/** Whether `value` is an {@link IdempotencyError}, also one from another copy of the package. */
export function isIdempotencyError(value: unknown): value is IdempotencyError {
  return value instanceof Error && value.name === 'IdempotencyError' && 'code' in value && 'status' in value;
}

/**
 * Thrown by `ctx.step` and `ctx.phase` when the store refused the step's save: another request
 * took the key over (this handler's lease was lost). The handler should stop; the engine then
 * answers the request as it answers a handler that finished after a takeover.
 */
export class StepFencedError extends RetrysafeError {
  override name = 'StepFencedError';
}

/** Whether `value` is a {@link StepFencedError}, also one from another copy of the package. */
export function isStepFenced(value: unknown): value is StepFencedError {
  return value instanceof Error && value.name === 'StepFencedError';
}

/**
 * Thrown by a store's `atomic` when the handler ended the operation's transaction itself (a raw
 * `COMMIT` or `ROLLBACK`, an ORM transaction opened on a new wrapper of `ctx.tx`): its writes may be
 * committed without the answer. The store has kept a 500 answer on the key so that no retry runs
 * them again; the engine answers 500 and emits `transaction_ended`.
 */
export class TransactionEndedError extends RetrysafeError {
  override name = 'TransactionEndedError';
}

/** Whether `value` is a {@link TransactionEndedError}, also one from another copy of the package. */
export function isTransactionEnded(value: unknown): value is TransactionEndedError {
  return value instanceof Error && value.name === 'TransactionEndedError';
}
