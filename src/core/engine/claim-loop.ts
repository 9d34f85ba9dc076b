import type { ClaimInput, IdempotencyStore } from '../contract/index.js';
import { safeListener } from '../contract/index.js';
import type { ResolvedOptions } from '../options/index.js';
import type { CapturedResponse } from '../response/index.js';
import { inProgress, MAX_WAIT_SLICE_MS, storeDown } from '../response/index.js';
import type { IdempotencyContext, Outcome } from './adapter-contract.js';
import { atomicRunner } from './atomic-mode.js';
import { deadlineGuard } from './deadline.js';
import { leasedRunner } from './lease-mode.js';
import { engineEvents, waitResultOf } from './outcomes.js';

/**
 * The state machine past the key: claims it (lease or atomic mode), runs `run` once it is held,
 * waits for or rejects a concurrent owner, replays a saved answer. HTTP requests
 * (`createIdempotency`) and `idempotent` runs both come here once they have made their claim.
 */
export function claimLoop<Req, Tx>(config: ResolvedOptions<Req>) {
  const { store, mode } = config;
  // Every use is behind `if (emit)`: without a listener no event is built and the clock is read
  // only where a timeout or a lease needs it.
  const emit = config.onEvent && safeListener(config.onEvent);

  const events = engineEvents(config, emit);
  const { storeFailed, replayOrError, conflictOf, waited } = events;

  const guard = deadlineGuard(
    config.storeTimeoutMs,
    `${store.name} store did not answer within ${config.storeTimeoutMs} ms`,
  );

  const runLeased = leasedRunner<Req, Tx>(config, emit, guard, events);
  const runAtomic = atomicRunner<Req, Tx>(config, emit, events);

  async function execute(
    claim: ClaimInput,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
    acceptEncoding: string | undefined,
    // The request saved with an operation's first step, for the completer; none for `idempotent`.
    encodeRequest?: () => string,
  ): Promise<Outcome> {
    const { key } = claim;
    // When this attempt at the key began: one clock read serves the deadline, the claim's timeout
    // and its timing.
    let attemptMs = performance.now();
    const deadline = attemptMs + (config.concurrency === 'wait' ? config.waitMs : 0);
    // Time in claims (lease mode), and since the key was first found in progress.
    let storeMs = 0;
    let waitingSinceMs: number | undefined;
    for (;;) {
      let retryAfterMs: number;
      if (mode === 'atomic') {
        // In atomic mode a duplicate's claim waits on the original's open transaction: within `wait`.
        let outcome: Awaited<ReturnType<typeof runAtomic>>;
        try {
          outcome = await runAtomic(
            { ...claim, waitMs: Math.max(0, deadline - attemptMs) },
            run,
            acceptEncoding,
            attemptMs,
          );
        } catch (error) {
          waited(claim, waitingSinceMs, 'acquired');
          throw error;
        }
        if (outcome.kind !== 'in_progress') {
          waited(claim, waitingSinceMs, waitResultOf(outcome));
          return outcome;
        }
        retryAfterMs = outcome.retryAfterMs;
      } else {
        let result: Awaited<ReturnType<IdempotencyStore['claim']>>;
        const claiming = store.claim(claim);
        try {
          result = await guard(claiming, attemptMs);
        } catch (error) {
          storeFailed('claim', claim, error);
          waited(claim, waitingSinceMs, 'store_error');
          // The client is told nothing ran, so a claim that still lands after the timeout must not
          // hold the key for a whole lease: it is released as soon as it answers.
          claiming
            .then(
              (late) => late.outcome === 'acquired' && store.release(claim.scope, key, late.token),
              () => undefined,
            )
            .catch(() => undefined);
          return { kind: 'rejected', error: storeDown(error, key) };
        }
        const claimedMs = performance.now();
        storeMs += claimedMs - attemptMs;
        switch (result.outcome) {
          case 'acquired':
            waited(claim, waitingSinceMs, 'acquired');
            return runLeased(
              claim,
              result.token,
              run,
              storeMs,
              claimedMs,
              acceptEncoding,
              result.steps,
              encodeRequest,
            );
          case 'replay':
            waited(claim, waitingSinceMs, 'replayed');
            return replayOrError(result.response, claim, storeMs, acceptEncoding);
          case 'mismatch':
            waited(claim, waitingSinceMs, 'conflict');
            return conflictOf(claim, storeMs);
        }
        retryAfterMs = result.retryAfterMs;
      }
      const nowMs = performance.now();
      if (emit) waitingSinceMs ??= nowMs;
      const remainingMs = deadline - nowMs;
      if (remainingMs <= 0) {
        waited(claim, waitingSinceMs, 'in_progress');
        return { kind: 'rejected', error: inProgress(key, retryAfterMs) };
      }
      try {
        await store.wait(claim.scope, key, Math.min(remainingMs, retryAfterMs + 1, MAX_WAIT_SLICE_MS));
      } catch (error) {
        storeFailed('wait', claim, error);
        waited(claim, waitingSinceMs, 'store_error');
        return { kind: 'rejected', error: storeDown(error, key) };
      }
      attemptMs = performance.now();
    }
  }

  return { emit, events, guard, runLeased, execute };
}
