import type {
  ClaimInput,
  ClaimResult,
  IdempotencyEventListener,
  ReleasedEvent,
  StoredResponse,
} from '../contract/index.js';
import type { ResolvedOptions } from '../options/index.js';
import type { CapturedResponse } from '../response/index.js';
import { inProgress, toStored } from '../response/index.js';
import type { IdempotencyContext, Outcome } from './adapter-contract.js';
import type { deadlineGuard } from './deadline.js';
import { handlerContext } from './handler-context.js';
import { leaseKeeper } from './lease-keeper.js';
import type { EngineEvents } from './outcomes.js';

/**
 * Lease mode's step once the key is claimed: runs the handler while its lease is renewed, then
 * saves its response or frees the key.
 */
export function leasedRunner<Req, Tx>(
  config: ResolvedOptions<Req>,
  emit: IdempotencyEventListener | undefined,
  guard: ReturnType<typeof deadlineGuard>,
  events: EngineEvents,
) {
  const { store, leaseMs, storeStatus } = config;
  const { storeFailed, replayOrError, conflictOf } = events;
  const leases = leaseKeeper(store, leaseMs, emit);

  /** Frees the key after the handler ran (or threw) and reports why; `storeMs` is the claims' time. */
  async function release(
    claim: ClaimInput,
    token: string,
    reason: ReleasedEvent['reason'],
    status: number | undefined,
    handlerMs: number,
    storeMs: number,
  ): Promise<void> {
    const startMs = performance.now();
    let released: boolean | undefined;
    try {
      released = await guard(store.release(claim.scope, claim.key, token), startMs);
    } catch (error) {
      storeFailed('release', claim, error);
    }
    if (!emit) return;
    // Another request took the key over while the handler ran: the work may have run twice.
    if (released === false) emit({ type: 'fenced', key: claim.key, scope: claim.scope, step: 'release' });
    storeMs += performance.now() - startMs;
    emit({ type: 'released', key: claim.key, scope: claim.scope, reason, status, handlerMs, storeMs });
  }

  async function runLeased(
    claim: ClaimInput,
    token: string,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
    storeMs: number,
    startMs: number,
    acceptEncoding: string | undefined,
  ): Promise<Outcome> {
    const lease = leases.hold(claim.scope, claim.key, token, startMs);
    let response: CapturedResponse;
    try {
      response = await run(handlerContext<Tx>(claim, undefined));
    } catch (error) {
      leases.drop(lease);
      // The handler failed: free the key so the client's retry runs again, then let the
      // framework answer the error as it would without us.
      await release(
        claim,
        token,
        'handler_threw',
        undefined,
        emit ? performance.now() - startMs : 0,
        storeMs,
      );
      throw error;
    }
    leases.drop(lease);
    const handlerEndMs = performance.now();
    const handlerMs = handlerEndMs - startMs;
    if (response.complete && storeStatus(response.status)) {
      const stored = toStored(config, response);
      // A failed save leaves the record in progress until its lease passes: retries wait or get
      // 409 rather than running the work a second time while this response is on its way.
      let saved: boolean | undefined;
      try {
        saved = await guard(store.complete(claim.scope, claim.key, token, stored), handlerEndMs);
      } catch (error) {
        saved = storeFailed('complete', claim, error);
      }
      if (emit) storeMs += performance.now() - handlerEndMs;
      if (saved === false) return answerLate(claim, response, stored, handlerMs, storeMs, acceptEncoding);
      if (emit) {
        const { status } = response;
        emit({ type: 'executed', key: claim.key, scope: claim.scope, status, handlerMs, storeMs });
      }
    } else {
      const reason = response.complete ? 'not_stored' : 'response_too_large';
      await release(claim, token, reason, response.status, handlerMs, storeMs);
    }
    return { kind: 'executed', response };
  }

  /**
   * The handler finished after another request took its key over, so its response was not saved
   * and must not be sent as if it were: the client gets the answer saved for the key when there
   * is one, 409 + Retry-After while the other request runs, and this response only once it is
   * saved (when nothing else was).
   */
  async function answerLate(
    claim: ClaimInput,
    response: CapturedResponse,
    stored: StoredResponse,
    handlerMs: number,
    storeMs: number,
    acceptEncoding: string | undefined,
  ): Promise<Outcome> {
    // Another request took the key over while the handler ran: the work may have run twice.
    if (emit) emit({ type: 'fenced', key: claim.key, scope: claim.scope, step: 'complete' });
    const startMs = performance.now();
    const busy = (): Outcome => ({ kind: 'rejected', error: inProgress(claim.key, leaseMs) });
    let result: ClaimResult;
    try {
      result = await guard(store.claim(claim), startMs);
    } catch (error) {
      storeFailed('claim', claim, error);
      return busy();
    }
    if (emit) storeMs += performance.now() - startMs;
    switch (result.outcome) {
      case 'replay':
        return replayOrError(result.response, claim, storeMs, acceptEncoding);
      case 'mismatch':
        return conflictOf(claim, storeMs);
      case 'in_progress':
        return { kind: 'rejected', error: inProgress(claim.key, result.retryAfterMs) };
      case 'acquired': {
        // Nothing was saved (the request that took over failed, or retention passed): this
        // response is what the work produced, so it is saved now and then sent.
        const saved = await guard(
          store.complete(claim.scope, claim.key, result.token, stored),
          performance.now(),
        ).catch((error) => storeFailed('complete', claim, error) ?? false);
        if (!saved) return busy();
        if (emit) {
          storeMs += performance.now() - startMs;
          const { status } = response;
          emit({ type: 'executed', key: claim.key, scope: claim.scope, status, handlerMs, storeMs });
        }
        return { kind: 'executed', response };
      }
    }
  }

  return runLeased;
}
