import type { ClaimInput, IdempotencyStore } from '../contract/index.js';
import { isIdempotencyError, safeListener } from '../contract/index.js';
import type { IdempotencyOptions } from '../options/index.js';
import { resolveOptions } from '../options/index.js';
import type { IncomingRequest } from '../request/index.js';
import { fingerprint, parseIdempotencyKey, type RequestBody } from '../request/index.js';
import type { CapturedResponse } from '../response/index.js';
import {
  bodyTooLarge,
  inProgress,
  keyInvalid,
  keyMissing,
  MAX_WAIT_SLICE_MS,
  ResponseCollector,
  render,
  storeDown,
} from '../response/index.js';
import type { Idempotency, IdempotencyContext, Outcome } from './adapter-contract.js';
import { atomicRunner } from './atomic-mode.js';
import { deadlineGuard } from './deadline.js';
import { leasedRunner } from './lease-mode.js';
import { engineEvents, waitResultOf } from './outcomes.js';

const PASS: Outcome = Object.freeze({ kind: 'pass' });

/**
 * Creates the engine adapters wrap. Options are checked here, once.
 * @example
 * const idempotency = createIdempotency({ store: sqliteStore({ filename: 'app.db' }), ttl: '7d' });
 */
export function createIdempotency<Req = unknown, Tx = unknown>(
  options: IdempotencyOptions<Req, Tx>,
): Idempotency<Req, Tx> {
  const config = resolveOptions(options);
  const { store, mode } = config;
  const overflow = mode === 'lease' ? 'stream' : 'drop';
  // Every use is behind `if (emit)`: without a listener no event is built and the clock is read
  // only where a timeout or a lease needs it.
  const emit = config.onEvent && safeListener(config.onEvent);

  const events = engineEvents(config, emit);
  const { rejected, storeFailed, replayOrError, conflictOf, waited } = events;

  const guard = deadlineGuard(
    config.storeTimeoutMs,
    `${store.name} store did not answer within ${config.storeTimeoutMs} ms`,
  );

  const runLeased = leasedRunner<Req, Tx>(config, emit, guard, events);
  const runAtomic = atomicRunner<Req, Tx>(config, emit, events);

  async function handle(
    request: IncomingRequest<Req>,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome> {
    if (!config.methods.has(request.method.toUpperCase())) return PASS;
    const parsed = parseIdempotencyKey(
      config.keyOf === undefined ? request.keyHeader : await config.keyOf(request.raw),
      config.bounds,
    );
    if (parsed.ok === 'absent') {
      if (!config.required) return PASS;
      return rejected(keyMissing(), 'key_missing');
    }
    if (!parsed.ok) return rejected(keyInvalid(parsed.reason), 'key_invalid');
    const { key } = parsed;
    let body: RequestBody;
    try {
      const read = request.readBody();
      body = read instanceof Promise ? await read : read;
    } catch (error) {
      if (isIdempotencyError(error)) return { kind: 'rejected', error };
      throw error;
    }
    // A parser in front may allow more than we do: what it read is held to our limit too.
    if ((body instanceof Uint8Array ? body : body.parsed).byteLength > config.maxBodyBytes) {
      return rejected(bodyTooLarge(config), 'body_too_large');
    }
    const scoped = config.scopeOf(request);
    const claim: ClaimInput = {
      scope: typeof scoped === 'string' ? scoped : await scoped,
      key,
      fingerprint: fingerprint(
        { method: request.method, path: request.path, contentType: request.contentType, body },
        config.fingerprintBody,
      ),
      leaseMs: config.leaseMs,
      ttlMs: config.ttlMs,
      timeoutMs: config.storeTimeoutMs,
    };

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
            request.acceptEncoding,
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
            return runLeased(claim, result.token, run, storeMs, claimedMs, request.acceptEncoding);
          case 'replay':
            waited(claim, waitingSinceMs, 'replayed');
            return replayOrError(result.response, claim, storeMs, request.acceptEncoding);
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

  return {
    mode,
    keyHeader: config.keyHeader,
    maxBodyBytes: config.maxBodyBytes,
    maxResponseBytes: config.maxResponseBytes,
    handle,
    render: (error) => render(config, error),
    // Every adapter makes this error once per oversized request, guarded or not yet known to be.
    bodyTooLarge: () => {
      const error = bodyTooLarge(config);
      if (emit) emit({ type: 'rejected', reason: 'body_too_large' });
      return error;
    },
    collect: () => new ResponseCollector(config.maxResponseBytes, overflow, config.storedHeaderNames),
  };
}
