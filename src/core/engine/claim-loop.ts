import type { ClaimInput, IdempotencyStore } from '../contract/index.js';
import type { CapturedResponse } from '../response/index.js';
import { inProgress, MAX_WAIT_SLICE_MS, storeDown } from '../response/index.js';
import type { IdempotencyContext, Outcome } from './adapter-contract.js';
import { runAtomic } from './atomic-mode.js';
import { runLeased } from './lease-mode.js';
import {
  circuitRefusal,
  conflictOf,
  replayOrError,
  storeAnswered,
  storeFailed,
  waited,
  waitResultOf,
} from './outcomes.js';
import type { Engine } from './state.js';

/**
 * A request or a run made ready for the claim loop, or the outcome that settled it before any
 * claim (a missing key, an oversized body).
 */
export type Prepared =
  | Outcome
  | {
      claim: ClaimInput;
      /** The retry's `Accept-Encoding`, which a compressed replay is decoded for. */
      acceptEncoding?: string | undefined;
      /** The request saved with an operation's first step, for the completer. */
      encodeRequest?: () => string;
    };

/**
 * The state machine past the key: claims it (lease or atomic mode), runs `run` once it is held,
 * waits for or rejects a concurrent owner, replays a saved answer. HTTP requests
 * (`createIdempotency`) and `idempotent` runs both come here with what makes their claim:
 * `prepare` runs inside this one async call (so it costs the caller no async layer of its own),
 * and answers at once unless it has something to wait for.
 */
export async function execute<Req, Tx>(
  engine: Engine<Req>,
  prepare: () => Prepared | Promise<Prepared>,
  run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
): Promise<Outcome> {
  const preparing = prepare();
  const prepared = preparing instanceof Promise ? await preparing : preparing;
  if ('kind' in prepared) return prepared;
  const { claim, acceptEncoding, encodeRequest } = prepared;
  const { config, emit, guard } = engine;
  const { store, mode } = config;
  const { key } = claim;
  // When this attempt at the key began: one clock read serves the deadline, the claim's timeout
  // and its timing.
  let attemptMs = performance.now();
  const refused = circuitRefusal(engine, claim, attemptMs);
  if (refused) return refused;
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
          engine,
          { ...claim, waitMs: Math.max(0, deadline - attemptMs) },
          run,
          acceptEncoding,
          attemptMs,
        );
      } catch (error) {
        waited(engine, claim, waitingSinceMs, 'acquired');
        throw error;
      }
      if (outcome.kind !== 'in_progress') {
        waited(engine, claim, waitingSinceMs, waitResultOf(outcome));
        return outcome;
      }
      retryAfterMs = outcome.retryAfterMs;
    } else {
      let result: Awaited<ReturnType<IdempotencyStore['claim']>>;
      const claiming = store.claim(claim);
      try {
        result = await guard(claiming, attemptMs);
      } catch (error) {
        storeFailed(engine, 'claim', claim, error);
        waited(engine, claim, waitingSinceMs, 'store_error');
        // The client is told nothing ran, so a claim that still lands after the timeout must not
        // hold the key for a whole lease: it lets go as soon as it answers. A takeover that got
        // finished steps back only ends its lease: a release would delete them, and the next
        // retry would run them again (a second charge).
        claiming
          .then(
            (late) => {
              if (late.outcome !== 'acquired') return;
              return late.steps?.length
                ? store.renew(claim.scope, key, late.token, 1)
                : store.release(claim.scope, key, late.token);
            },
            () => undefined,
          )
          .catch(() => undefined);
        return { kind: 'rejected', error: storeDown(error, key) };
      }
      storeAnswered(engine);
      const claimedMs = performance.now();
      storeMs += claimedMs - attemptMs;
      switch (result.outcome) {
        case 'acquired':
          waited(engine, claim, waitingSinceMs, 'acquired');
          // Awaited: an async call's promise returned as it is costs two more turns to adopt.
          return await runLeased(
            engine,
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
          waited(engine, claim, waitingSinceMs, 'replayed');
          return replayOrError(engine, result.response, claim, storeMs, acceptEncoding);
        case 'mismatch':
          waited(engine, claim, waitingSinceMs, 'conflict');
          return conflictOf(engine, claim, storeMs);
      }
      retryAfterMs = result.retryAfterMs;
    }
    const nowMs = performance.now();
    if (emit) waitingSinceMs ??= nowMs;
    const remainingMs = deadline - nowMs;
    if (remainingMs <= 0) {
      waited(engine, claim, waitingSinceMs, 'in_progress');
      return { kind: 'rejected', error: inProgress(key, retryAfterMs) };
    }
    try {
      await store.wait(claim.scope, key, Math.min(remainingMs, retryAfterMs + 1, MAX_WAIT_SLICE_MS));
    } catch (error) {
      storeFailed(engine, 'wait', claim, error);
      waited(engine, claim, waitingSinceMs, 'store_error');
      return { kind: 'rejected', error: storeDown(error, key) };
    }
    attemptMs = performance.now();
  }
}
