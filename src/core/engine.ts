import { createHash } from 'node:crypto';
import type {
  CapturedResponse,
  Idempotency,
  IdempotencyContext,
  IncomingRequest,
  Outcome,
} from './adapter-contract.js';
import { ResponseCollector } from './collector.js';
import { deadlineGuard } from './deadline.js';
import { ErrorCode, type IdempotencyError, isIdempotencyError } from './errors.js';
import {
  type RejectedEvent,
  type ReleasedEvent,
  type StoreErrorEvent,
  safeListener,
  type WaitedEvent,
} from './events.js';
import { fingerprint } from './fingerprint.js';
import { parseIdempotencyKey } from './key.js';
import { leaseKeeper } from './lease.js';
import { type IdempotencyOptions, resolveOptions } from './options.js';
import {
  bodyTooLarge,
  conflict,
  inProgress,
  keyInvalid,
  keyMissing,
  MAX_WAIT_SLICE_MS,
  render,
  replayUnreadable,
  responseTooLarge,
  storeDown,
  toReplay,
  toStored,
} from './responses.js';
import type { AtomicStore, ClaimInput, ClaimResult, IdempotencyStore, StoredResponse } from './types.js';

// The engine's names, where adapters and tests have always imported them from.
export type {
  CapturedResponse,
  Idempotency,
  IdempotencyContext,
  IncomingRequest,
  Outcome,
} from './adapter-contract.js';
export { DEFAULT_REPLAY_HEADERS, defaultStoreStatus, type IdempotencyOptions } from './options.js';
export { REPLAYED_HEADER } from './responses.js';

const PASS: Outcome = Object.freeze({ kind: 'pass' });

/** How a wait ended, from the outcome of the atomic call that ended it. */
function waitResultOf(outcome: Outcome): WaitedEvent['result'] {
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
 * Creates the engine adapters wrap. Options are checked here, once.
 * @example
 * const idempotency = createIdempotency({ store: sqliteStore({ filename: 'app.db' }), ttl: '7d' });
 */
export function createIdempotency<Req = unknown, Tx = unknown>(
  options: IdempotencyOptions<Req, Tx>,
): Idempotency<Req, Tx> {
  const config = resolveOptions(options);
  const {
    store,
    mode,
    keyHeader,
    keyOf,
    concurrency,
    ttlMs,
    leaseMs,
    waitMs,
    storeTimeoutMs,
    bounds,
    maxBodyBytes,
    maxResponseBytes,
    methods,
    scopeOf,
    storeStatus,
    storedHeaderNames,
  } = config;
  const overflow = mode === 'lease' ? 'stream' : 'drop';
  // Every use is behind `if (emit)`: without a listener no event is built and no clock is read.
  const emit = config.onEvent && safeListener(config.onEvent);

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

  const guard = deadlineGuard(
    storeTimeoutMs,
    `${store.name} store did not answer within ${storeTimeoutMs} ms`,
  );

  function replayOrError(stored: StoredResponse, claim: ClaimInput, storeMs: number): Outcome {
    let response: StoredResponse;
    try {
      response = toReplay(config, stored);
    } catch (cause) {
      return rejected(replayUnreadable(cause, claim.key), 'replay_unreadable', claim.scope);
    }
    if (emit)
      emit({ type: 'replayed', key: claim.key, scope: claim.scope, status: response.status, storeMs });
    return { kind: 'replayed', response };
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

  function context(claim: ClaimInput, tx: Tx | undefined): IdempotencyContext<Tx> {
    return {
      key: claim.key,
      scope: claim.scope,
      fingerprint: claim.fingerprint,
      tx,
      downstreamKey: (purpose) =>
        createHash('sha256').update(`${claim.scope}\n${claim.key}\n${purpose}`).digest('base64url'),
    };
  }

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
    const startMs = emit ? performance.now() : 0;
    let released: boolean | undefined;
    try {
      released = await guard(store.release(claim.scope, claim.key, token));
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
  ): Promise<Outcome> {
    const lease = leases.hold(claim.scope, claim.key, token);
    let response: CapturedResponse;
    try {
      response = await run(context(claim, undefined));
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
    const handlerMs = emit ? performance.now() - startMs : 0;
    if (response.complete && storeStatus(response.status)) {
      const stored = toStored(config, response);
      // A failed save leaves the record in progress until its lease passes: retries wait or get
      // 409 rather than running the work a second time while this response is on its way.
      let saved: boolean | undefined;
      try {
        saved = await guard(store.complete(claim.scope, claim.key, token, stored));
      } catch (error) {
        saved = storeFailed('complete', claim, error);
      }
      if (emit) storeMs += performance.now() - startMs - handlerMs;
      if (saved === false) return answerLate(claim, response, stored, handlerMs, storeMs);
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
  ): Promise<Outcome> {
    // Another request took the key over while the handler ran: the work may have run twice.
    if (emit) emit({ type: 'fenced', key: claim.key, scope: claim.scope, step: 'complete' });
    const startMs = emit ? performance.now() : 0;
    const busy = (): Outcome => ({ kind: 'rejected', error: inProgress(claim.key, leaseMs) });
    let result: ClaimResult;
    try {
      result = await guard(store.claim(claim));
    } catch (error) {
      storeFailed('claim', claim, error);
      return busy();
    }
    if (emit) storeMs += performance.now() - startMs;
    switch (result.outcome) {
      case 'replay':
        return replayOrError(result.response, claim, storeMs);
      case 'mismatch':
        return conflictOf(claim, storeMs);
      case 'in_progress':
        return { kind: 'rejected', error: inProgress(claim.key, result.retryAfterMs) };
      case 'acquired': {
        // Nothing was saved (the request that took over failed, or retention passed): this
        // response is what the work produced, so it is saved now and then sent.
        const saved = await guard(store.complete(claim.scope, claim.key, result.token, stored)).catch(
          (error) => storeFailed('complete', claim, error) ?? false,
        );
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

  async function runAtomic(
    claim: ClaimInput,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome | { kind: 'in_progress'; retryAfterMs: number }> {
    let handlerFailed = false;
    let handlerError: unknown;
    let captured: CapturedResponse | undefined;
    const startMs = emit ? performance.now() : 0;
    let handlerMs = 0;
    // The store's share of the call: everything but the handler (claim, save, commit).
    const storeMs = () => performance.now() - startMs - handlerMs;
    try {
      const result = await (store as AtomicStore<Tx>).atomic(claim, async (tx) => {
        const handlerStartMs = emit ? performance.now() : 0;
        try {
          captured = await run(context(claim, tx));
        } catch (error) {
          handlerFailed = true;
          handlerError = error;
          throw error;
        } finally {
          if (emit) handlerMs = performance.now() - handlerStartMs;
        }
        if (!captured.complete) {
          // Nothing may reach the client before the commit, so an oversized response cannot be
          // streamed: roll everything back and say why.
          return { response: toStored(config, captured), commit: false };
        }
        return { response: toStored(config, captured), commit: storeStatus(captured.status) };
      });
      switch (result.outcome) {
        case 'executed': {
          const { status, complete } = captured!;
          if (emit) {
            const event = { key: claim.key, scope: claim.scope, status, handlerMs, storeMs: storeMs() };
            if (result.committed) emit({ type: 'executed', ...event });
            else emit({ type: 'released', reason: complete ? 'not_stored' : 'response_too_large', ...event });
          }
          if (!complete) {
            return {
              kind: 'rejected',
              error: responseTooLarge(config, claim.key),
            };
          }
          return { kind: 'executed', response: captured! };
        }
        case 'replay':
          return replayOrError(result.response, claim, emit ? storeMs() : 0);
        case 'mismatch':
          return conflictOf(claim, emit ? storeMs() : 0);
        case 'in_progress':
          return { kind: 'in_progress', retryAfterMs: result.retryAfterMs };
      }
    } catch (error) {
      if (handlerFailed) {
        if (emit) {
          const { key, scope } = claim;
          emit({ type: 'released', key, scope, reason: 'handler_threw', handlerMs, storeMs: storeMs() });
        }
        throw handlerError;
      }
      storeFailed('atomic', claim, error);
      return { kind: 'rejected', error: storeDown(error, claim.key) };
    }
  }

  async function handle(
    request: IncomingRequest<Req>,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome> {
    if (!methods.has(request.method.toUpperCase())) return PASS;
    const parsed = parseIdempotencyKey(
      keyOf === undefined ? request.keyHeader : await keyOf(request.raw),
      bounds,
    );
    if (parsed.ok === 'absent') {
      if (!config.required) return PASS;
      return rejected(keyMissing(), 'key_missing');
    }
    if (!parsed.ok) return rejected(keyInvalid(parsed.reason), 'key_invalid');
    const { key } = parsed;
    let body: Uint8Array;
    try {
      const read = request.readBody();
      body = read instanceof Uint8Array ? read : await read;
    } catch (error) {
      if (isIdempotencyError(error)) return { kind: 'rejected', error };
      throw error;
    }
    const scoped = scopeOf(request);
    const claim: ClaimInput = {
      scope: typeof scoped === 'string' ? scoped : await scoped,
      key,
      fingerprint: fingerprint(
        { method: request.method, path: request.path, contentType: request.contentType, body },
        config.fingerprintBody,
      ),
      leaseMs,
      ttlMs,
      timeoutMs: storeTimeoutMs,
    };

    const deadline = Date.now() + (concurrency === 'wait' ? waitMs : 0);
    // Time in claims (lease mode), and since the key was first found in progress.
    let storeMs = 0;
    let waitingSinceMs: number | undefined;
    for (;;) {
      let retryAfterMs: number;
      if (mode === 'atomic') {
        // In atomic mode a duplicate's claim waits on the original's open transaction: within `wait`.
        let outcome: Awaited<ReturnType<typeof runAtomic>>;
        try {
          outcome = await runAtomic({ ...claim, waitMs: Math.max(0, deadline - Date.now()) }, run);
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
        const startMs = emit ? performance.now() : 0;
        let result: Awaited<ReturnType<IdempotencyStore['claim']>>;
        const claiming = store.claim(claim);
        try {
          result = await guard(claiming);
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
        const claimedMs = emit ? performance.now() : 0;
        storeMs += claimedMs - startMs;
        switch (result.outcome) {
          case 'acquired':
            waited(claim, waitingSinceMs, 'acquired');
            return runLeased(claim, result.token, run, storeMs, claimedMs);
          case 'replay':
            waited(claim, waitingSinceMs, 'replayed');
            return replayOrError(result.response, claim, storeMs);
          case 'mismatch':
            waited(claim, waitingSinceMs, 'conflict');
            return conflictOf(claim, storeMs);
        }
        retryAfterMs = result.retryAfterMs;
      }
      if (emit) waitingSinceMs ??= performance.now();
      const remainingMs = deadline - Date.now();
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
    }
  }

  return {
    mode,
    keyHeader,
    maxBodyBytes,
    maxResponseBytes,
    handle,
    render: (error) => render(config, error),
    // Every adapter makes this error once per oversized request, guarded or not yet known to be.
    bodyTooLarge: () => {
      const error = bodyTooLarge(config);
      if (emit) emit({ type: 'rejected', reason: 'body_too_large' });
      return error;
    },
    collect: () => new ResponseCollector(maxResponseBytes, overflow, storedHeaderNames),
  };
}
