import type {
  ClaimInput,
  RejectedEvent,
  StoredResponse,
  StoreErrorEvent,
  WaitedEvent,
} from '../contract/index.js';
import { ErrorCode, type IdempotencyError } from '../contract/index.js';
import { circuitOpen, conflict, forAcceptEncoding, replayUnreadable, toReplay } from '../response/index.js';
import type { Outcome } from './adapter-contract.js';
import type { Engine } from './state.js';

// The engine's steps that are reported as they happen: each answers its outcome (or notes a failed
// store call) and emits its event when there is a listener.

/** How a wait ended, from the outcome of the atomic call that ended it. */
export function waitResultOf(outcome: Outcome): WaitedEvent['result'] {
  if (outcome.kind !== 'rejected') return outcome.kind === 'replayed' ? 'replayed' : 'acquired';
  switch (outcome.error.code) {
    case ErrorCode.keyConflict:
      return 'conflict';
    case ErrorCode.storeUnavailable:
      return 'store_error';
    case ErrorCode.replayUnreadable:
      return 'replayed';
    default:
      return 'acquired';
  }
}

export function rejected<Req>(
  { emit }: Engine<Req>,
  error: IdempotencyError,
  reason: RejectedEvent['reason'],
  scope?: string,
): Outcome {
  if (emit) emit({ type: 'rejected', reason, key: error.key, scope });
  return { kind: 'rejected', error };
}

/** Reports the failure of a store call (a throw or a timeout); answers `undefined`. */
export function storeFailed<Req>(
  { config, emit, breaker }: Engine<Req>,
  operation: StoreErrorEvent['operation'],
  claim: ClaimInput,
  error: unknown,
): undefined {
  if (emit) emit({ type: 'store_error', operation, key: claim.key, scope: claim.scope, error });
  if (breaker?.failed(performance.now()) && emit) {
    emit({ type: 'circuit', state: 'open', store: config.store.name, failures: breaker.failures });
  }
  return undefined;
}

/** Notes a store call that answered, which closes an open circuit. */
export function storeAnswered<Req>({ config, emit, breaker }: Engine<Req>): void {
  if (breaker?.succeeded() && emit)
    emit({ type: 'circuit', state: 'closed', store: config.store.name, failures: 0 });
}

/**
 * The refusal of a request while the store's circuit is open (without asking the store), or
 * `undefined` when it may go to the store: closed, or this request is the cooldown's probe.
 */
export function circuitRefusal<Req>(
  engine: Engine<Req>,
  claim: ClaimInput,
  nowMs: number,
): Outcome | undefined {
  const { breaker } = engine;
  const retryAfterMs = breaker?.refusal(nowMs);
  if (retryAfterMs === undefined) return undefined;
  return rejected(
    engine,
    circuitOpen(claim.key, retryAfterMs, breaker!.failures),
    'circuit_open',
    claim.scope,
  );
}

/** The replay of `stored`, decoded when the retry does not accept the coding it was stored in. */
export function replayOrError<Req>(
  engine: Engine<Req>,
  stored: StoredResponse,
  claim: ClaimInput,
  storeMs: number,
  acceptEncoding: string | undefined,
): Outcome | Promise<Outcome> {
  let response: StoredResponse;
  try {
    response = toReplay(engine.config, stored, claim.key);
  } catch (cause) {
    return rejected(engine, replayUnreadable(cause, claim.key), 'replay_unreadable', claim.scope);
  }
  const { emit } = engine;
  if (emit) emit({ type: 'replayed', key: claim.key, scope: claim.scope, status: response.status, storeMs });
  // Only a compressed body can need this, so the common replay stays synchronous.
  if (response.headers['content-encoding'] === undefined) return { kind: 'replayed', response };
  return forAcceptEncoding(response, acceptEncoding).then((decoded) => ({
    kind: 'replayed',
    response: decoded,
  }));
}

export function conflictOf<Req>({ config, emit }: Engine<Req>, claim: ClaimInput, storeMs: number): Outcome {
  if (emit) emit({ type: 'conflict', key: claim.key, scope: claim.scope, storeMs });
  return { kind: 'rejected', error: conflict(config, claim.key) };
}

export function waited<Req>(
  { emit }: Engine<Req>,
  claim: ClaimInput,
  sinceMs: number | undefined,
  result: WaitedEvent['result'],
): void {
  if (emit && sinceMs !== undefined) {
    const waitedMs = performance.now() - sinceMs;
    emit({ type: 'waited', key: claim.key, scope: claim.scope, waitedMs, result });
  }
}
