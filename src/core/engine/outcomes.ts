import type {
  ClaimInput,
  IdempotencyEventListener,
  RejectedEvent,
  StoredResponse,
  StoreErrorEvent,
  WaitedEvent,
} from '../contract/index.js';
import { ErrorCode, type IdempotencyError } from '../contract/index.js';
import type { ResolvedOptions } from '../options/index.js';
import { conflict, forAcceptEncoding, replayUnreadable, toReplay } from '../response/index.js';
import type { Outcome } from './adapter-contract.js';

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

/**
 * The engine's steps that are reported as they happen: each answers its outcome (or notes a failed
 * store call) and emits its event when there is a listener.
 */
export function engineEvents<Req>(config: ResolvedOptions<Req>, emit: IdempotencyEventListener | undefined) {
  function rejected(error: IdempotencyError, reason: RejectedEvent['reason'], scope?: string): Outcome {
    if (emit) emit({ type: 'rejected', reason, key: error.key, scope });
    return { kind: 'rejected', error };
  }

  /** Reports the failure of a store call (a throw or a timeout); answers `undefined`. */
  function storeFailed(
    operation: StoreErrorEvent['operation'],
    claim: ClaimInput,
    error: unknown,
  ): undefined {
    if (emit) emit({ type: 'store_error', operation, key: claim.key, scope: claim.scope, error });
    return undefined;
  }

  /** The replay of `stored`, decoded when the retry does not accept the coding it was stored in. */
  function replayOrError(
    stored: StoredResponse,
    claim: ClaimInput,
    storeMs: number,
    acceptEncoding: string | undefined,
  ): Outcome | Promise<Outcome> {
    let response: StoredResponse;
    try {
      response = toReplay(config, stored);
    } catch (cause) {
      return rejected(replayUnreadable(cause, claim.key), 'replay_unreadable', claim.scope);
    }
    if (emit)
      emit({ type: 'replayed', key: claim.key, scope: claim.scope, status: response.status, storeMs });
    // Only a compressed body can need this, so the common replay stays synchronous.
    if (response.headers['content-encoding'] === undefined) return { kind: 'replayed', response };
    return forAcceptEncoding(response, acceptEncoding).then((decoded) => ({
      kind: 'replayed',
      response: decoded,
    }));
  }

  function conflictOf(claim: ClaimInput, storeMs: number): Outcome {
    if (emit) emit({ type: 'conflict', key: claim.key, scope: claim.scope, storeMs });
    return { kind: 'rejected', error: conflict(config, claim.key) };
  }

  function waited(claim: ClaimInput, sinceMs: number | undefined, result: WaitedEvent['result']): void {
    if (emit && sinceMs !== undefined) {
      const waitedMs = performance.now() - sinceMs;
      emit({ type: 'waited', key: claim.key, scope: claim.scope, waitedMs, result });
    }
  }

  return { rejected, storeFailed, replayOrError, conflictOf, waited };
}

export type EngineEvents = ReturnType<typeof engineEvents>;
