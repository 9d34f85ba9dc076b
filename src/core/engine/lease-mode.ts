import type { ClaimInput, ClaimResult, ReleasedEvent, SavedStep, StoredResponse } from '../contract/index.js';
import { isStepFenced } from '../contract/index.js';
import type { CapturedResponse } from '../response/index.js';
import { inProgress, replayUnreadable, toStored } from '../response/index.js';
import type { IdempotencyContext, Outcome } from './adapter-contract.js';
import { conflictOf, rejected, replayOrError, storeFailed } from './outcomes.js';
import type { Engine } from './state.js';
import { handlerContext, leasedSteps } from './steps.js';

/**
 * Frees the key after the handler ran (or threw) and reports why; `storeMs` is the claims' time.
 * An operation with finished steps keeps its record (a release would lose them): its lease is
 * ended instead, so the retry, or the completer, takes it over and resumes at the next step.
 */
async function release<Req>(
  engine: Engine<Req>,
  claim: ClaimInput,
  token: string,
  keepSteps: boolean,
  reason: ReleasedEvent['reason'],
  status: number | undefined,
  handlerMs: number,
  storeMs: number,
  renewing: Promise<void> | undefined,
): Promise<void> {
  const {
    config: { store },
    emit,
    guard,
  } = engine;
  // A renewal landing after the lease was ended would hold the key for another lease.
  if (keepSteps && renewing) await renewing;
  const startMs = performance.now();
  let released: boolean | undefined;
  try {
    const freeing = keepSteps
      ? store.renew(claim.scope, claim.key, token, 1)
      : store.release(claim.scope, claim.key, token);
    released = await guard(freeing, startMs);
  } catch (error) {
    storeFailed(engine, 'release', claim, error);
  }
  if (!emit) return;
  // Another request took the key over while the handler ran: the work may have run twice.
  if (released === false) emit({ type: 'fenced', key: claim.key, scope: claim.scope, step: 'release' });
  storeMs += performance.now() - startMs;
  emit({ type: 'released', key: claim.key, scope: claim.scope, reason, status, handlerMs, storeMs });
}

/**
 * The finished steps of a takeover were sealed with a key no longer in `encryptionKey`: the
 * handler cannot go on without their results and must not run them again (a second charge), so
 * the operation keeps them, its lease is ended, and the request is answered as a saved answer no
 * key opens is (500 `replay_unreadable`, a `rejected` event), until a key that opens them is back
 * or retention passes.
 */
async function unreadableSteps<Req>(
  engine: Engine<Req>,
  claim: ClaimInput,
  token: string,
  cause: unknown,
): Promise<Outcome> {
  const { config, guard } = engine;
  try {
    await guard(config.store.renew(claim.scope, claim.key, token, 1), performance.now());
  } catch (error) {
    storeFailed(engine, 'release', claim, error);
  }
  return rejected(engine, replayUnreadable(cause, claim.key), 'replay_unreadable', claim.scope);
}

/**
 * Lease mode's step once the key is claimed: runs the handler while its lease is renewed, then
 * saves its response or frees the key.
 */
export async function runLeased<Req, Tx>(
  engine: Engine<Req>,
  claim: ClaimInput,
  token: string,
  run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  storeMs: number,
  startMs: number,
  acceptEncoding: string | undefined,
  finished: readonly SavedStep[] | undefined,
  request: (() => string) | undefined,
): Promise<Outcome> {
  const { config, emit, guard, leases } = engine;
  const { store, leaseMs, storeStatus } = config;
  if (finished?.length) {
    try {
      for (const step of finished) engine.codec.decodeValue(step.value);
    } catch (cause) {
      return unreadableSteps(engine, claim, token, cause);
    }
  }
  const lease = leases.hold(claim.scope, claim.key, token, startMs);
  const steps = leasedSteps<Req, Tx>(engine, claim, token, finished, request);
  let response: CapturedResponse;
  try {
    response = await run(handlerContext<Tx>(claim, undefined, steps));
  } catch (error) {
    const renewing = leases.drop(lease);
    // A step's save was refused: the request that took the key over answers for it.
    if (isStepFenced(error)) return { kind: 'rejected', error: inProgress(claim.key, leaseMs) };
    // The handler failed: free the key so the client's retry runs again, then let the
    // framework answer the error as it would without us.
    await release(
      engine,
      claim,
      token,
      steps.hasFinished(),
      'handler_threw',
      undefined,
      emit ? performance.now() - startMs : 0,
      storeMs,
      renewing,
    );
    throw error;
  }
  const renewing = leases.drop(lease);
  const handlerEndMs = performance.now();
  const handlerMs = handlerEndMs - startMs;
  // A 4xx the handler chose after a step finished is its final answer: released, the operation
  // would be resumed (and its steps replayed) for ever, and the key cannot be freed without
  // losing what the steps did.
  const final = response.status >= 400 && response.status < 500 && steps.hasFinished();
  if (response.complete && (storeStatus(response.status) || final)) {
    const stored = toStored(config, response);
    // A failed save leaves the record in progress until its lease passes: retries wait or get
    // 409 rather than running the work a second time while this response is on its way.
    let saved: boolean | undefined;
    try {
      saved = await guard(store.complete(claim.scope, claim.key, token, stored), handlerEndMs);
    } catch (error) {
      saved = storeFailed(engine, 'complete', claim, error);
    }
    if (emit) storeMs += performance.now() - handlerEndMs;
    if (saved === false)
      return answerLate(engine, claim, response, stored, handlerMs, storeMs, acceptEncoding);
    if (emit) {
      const { status } = response;
      emit({ type: 'executed', key: claim.key, scope: claim.scope, status, handlerMs, storeMs });
    }
  } else {
    const reason = response.complete ? 'not_stored' : 'response_too_large';
    await release(
      engine,
      claim,
      token,
      steps.hasFinished(),
      reason,
      response.status,
      handlerMs,
      storeMs,
      renewing,
    );
  }
  return { kind: 'executed', response };
}

/**
 * The handler finished after another request took its key over, so its response was not saved
 * and must not be sent as if it were: the client gets the answer saved for the key when there
 * is one, 409 + Retry-After while the other request runs, and this response only once it is
 * saved (when nothing else was).
 */
async function answerLate<Req>(
  engine: Engine<Req>,
  claim: ClaimInput,
  response: CapturedResponse,
  stored: StoredResponse,
  handlerMs: number,
  storeMs: number,
  acceptEncoding: string | undefined,
): Promise<Outcome> {
  const {
    config: { store, leaseMs },
    emit,
    guard,
  } = engine;
  // Another request took the key over while the handler ran: the work may have run twice.
  if (emit) emit({ type: 'fenced', key: claim.key, scope: claim.scope, step: 'complete' });
  const startMs = performance.now();
  const busy = (): Outcome => ({ kind: 'rejected', error: inProgress(claim.key, leaseMs) });
  let result: ClaimResult;
  try {
    result = await guard(store.claim(claim), startMs);
  } catch (error) {
    storeFailed(engine, 'claim', claim, error);
    return busy();
  }
  if (emit) storeMs += performance.now() - startMs;
  switch (result.outcome) {
    case 'replay':
      return replayOrError(engine, result.response, claim, storeMs, acceptEncoding);
    case 'mismatch':
      return conflictOf(engine, claim, storeMs);
    case 'in_progress':
      return { kind: 'rejected', error: inProgress(claim.key, result.retryAfterMs) };
    case 'acquired': {
      // Nothing was saved (the request that took over failed, or retention passed): this
      // response is what the work produced, so it is saved now and then sent.
      const saved = await guard(
        store.complete(claim.scope, claim.key, result.token, stored),
        performance.now(),
      ).catch((error) => storeFailed(engine, 'complete', claim, error) ?? false);
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
