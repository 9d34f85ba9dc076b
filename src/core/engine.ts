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
import { isIdempotencyError } from './errors.js';
import { fingerprint } from './fingerprint.js';
import { parseIdempotencyKey } from './key.js';
import { leaseKeeper, reportLostLease } from './lease.js';
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

  const guard = deadlineGuard(
    storeTimeoutMs,
    `${store.name} store did not answer within ${storeTimeoutMs} ms`,
  );

  function replayOrError(stored: StoredResponse, key: string): Outcome {
    try {
      return { kind: 'replayed', response: toReplay(config, stored) };
    } catch (cause) {
      return {
        kind: 'rejected',
        error: replayUnreadable(cause, key),
      };
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

  const leases = leaseKeeper(store, leaseMs);

  async function release(claim: ClaimInput, token: string): Promise<void> {
    let released: boolean;
    try {
      released = await guard(store.release(claim.scope, claim.key, token));
    } catch {
      return;
    }
    if (!released) reportLostLease(store.name, claim.key, 'release');
  }

  async function runLeased(
    claim: ClaimInput,
    token: string,
    run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  ): Promise<Outcome> {
    const lease = leases.hold(claim.scope, claim.key, token);
    let response: CapturedResponse;
    try {
      response = await run(context(claim, undefined));
    } catch (error) {
      leases.drop(lease);
      // The handler failed: free the key so the client's retry runs again, then let the
      // framework answer the error as it would without us.
      await release(claim, token);
      throw error;
    }
    leases.drop(lease);
    if (response.complete && storeStatus(response.status)) {
      const stored = toStored(config, response);
      // A failed save leaves the record in progress until its lease passes: retries wait or get
      // 409 rather than running the work a second time while this response is on its way.
      let saved: boolean | undefined;
      try {
        saved = await guard(store.complete(claim.scope, claim.key, token, stored));
      } catch {
        saved = undefined;
      }
      if (saved === false) return answerLate(claim, response, stored);
    } else {
      await release(claim, token);
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
  ): Promise<Outcome> {
    reportLostLease(store.name, claim.key, 'complete');
    const busy = (): Outcome => ({ kind: 'rejected', error: inProgress(claim.key, leaseMs) });
    let result: ClaimResult;
    try {
      result = await guard(store.claim(claim));
    } catch {
      return busy();
    }
    switch (result.outcome) {
      case 'replay':
        return replayOrError(result.response, claim.key);
      case 'mismatch':
        return { kind: 'rejected', error: conflict(config, claim.key) };
      case 'in_progress':
        return { kind: 'rejected', error: inProgress(claim.key, result.retryAfterMs) };
      case 'acquired': {
        // Nothing was saved (the request that took over failed, or retention passed): this
        // response is what the work produced, so it is saved now and then sent.
        const saved = await guard(store.complete(claim.scope, claim.key, result.token, stored)).catch(
          () => false,
        );
        return saved ? { kind: 'executed', response } : busy();
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
    try {
      const result = await (store as AtomicStore<Tx>).atomic(claim, async (tx) => {
        try {
          captured = await run(context(claim, tx));
        } catch (error) {
          handlerFailed = true;
          handlerError = error;
          throw error;
        }
        if (!captured.complete) {
          // Nothing may reach the client before the commit, so an oversized response cannot be
          // streamed: roll everything back and say why.
          return { response: toStored(config, captured), commit: false };
        }
        return { response: toStored(config, captured), commit: storeStatus(captured.status) };
      });
      switch (result.outcome) {
        case 'executed':
          if (!captured!.complete) {
            return {
              kind: 'rejected',
              error: responseTooLarge(config, claim.key),
            };
          }
          return { kind: 'executed', response: captured! };
        case 'replay':
          return replayOrError(result.response, claim.key);
        case 'mismatch':
          return { kind: 'rejected', error: conflict(config, claim.key) };
        case 'in_progress':
          return { kind: 'in_progress', retryAfterMs: result.retryAfterMs };
      }
    } catch (error) {
      if (handlerFailed) throw handlerError;
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
      return { kind: 'rejected', error: keyMissing() };
    }
    if (!parsed.ok) {
      return { kind: 'rejected', error: keyInvalid(parsed.reason) };
    }
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
    for (;;) {
      let retryAfterMs: number;
      if (mode === 'atomic') {
        // In atomic mode a duplicate's claim waits on the original's open transaction: within `wait`.
        const outcome = await runAtomic({ ...claim, waitMs: Math.max(0, deadline - Date.now()) }, run);
        if (outcome.kind !== 'in_progress') return outcome;
        retryAfterMs = outcome.retryAfterMs;
      } else {
        let result: Awaited<ReturnType<IdempotencyStore['claim']>>;
        const claiming = store.claim(claim);
        try {
          result = await guard(claiming);
        } catch (error) {
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
        switch (result.outcome) {
          case 'acquired':
            return runLeased(claim, result.token, run);
          case 'replay':
            return replayOrError(result.response, key);
          case 'mismatch':
            return { kind: 'rejected', error: conflict(config, key) };
        }
        retryAfterMs = result.retryAfterMs;
      }
      const remainingMs = deadline - Date.now();
      if (remainingMs <= 0) return { kind: 'rejected', error: inProgress(key, retryAfterMs) };
      try {
        await store.wait(claim.scope, key, Math.min(remainingMs, retryAfterMs + 1, MAX_WAIT_SLICE_MS));
      } catch (error) {
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
    bodyTooLarge: () => bodyTooLarge(config),
    collect: () => new ResponseCollector(maxResponseBytes, overflow, storedHeaderNames),
  };
}
