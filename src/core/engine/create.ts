import type { AbandonedRecord, ClaimInput } from '../contract/index.js';
import { isIdempotencyError } from '../contract/index.js';
import type { IdempotencyOptions } from '../options/index.js';
import { resolveOptions } from '../options/index.js';
import type { IncomingRequest } from '../request/index.js';
import { fingerprint, parseIdempotencyKey, type RequestBody } from '../request/index.js';
import type { CapturedResponse } from '../response/index.js';
import {
  answerHeaders,
  bodyTooLarge,
  inProgress,
  keyInvalid,
  keyMissing,
  ResponseCollector,
  render,
} from '../response/index.js';
import type { Idempotency, IdempotencyContext, Outcome, ResumedRequest } from './adapter-contract.js';
import { claimLoop } from './claim-loop.js';
import { stepCodec } from './steps.js';

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
  const { emit, events, guard, runLeased, execute } = claimLoop<Req, Tx>(config);
  const { rejected, replayOrError, conflictOf } = events;
  const codec = stepCodec(config.cipher);

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
      retainMs: config.ttlMs,
      ttlMs: config.ttlMs,
      timeoutMs: config.storeTimeoutMs,
    };
    return execute(claim, run, request.acceptEncoding, () =>
      codec.encodeRequest({
        method: request.method,
        path: request.path,
        contentType: request.contentType,
        body: body instanceof Uint8Array ? body : body.parsed,
      }),
    );
  }

  async function resume(
    record: AbandonedRecord,
    run: (ctx: IdempotencyContext<Tx>, request: ResumedRequest) => Promise<CapturedResponse>,
  ): Promise<Outcome | undefined> {
    let request: ResumedRequest;
    try {
      request = codec.decodeRequest(record.request, record.scope, record.key);
    } catch {
      return undefined;
    }
    const claim: ClaimInput = {
      scope: record.scope,
      key: record.key,
      fingerprint: record.fingerprint,
      leaseMs: config.leaseMs,
      retainMs: config.ttlMs,
      ttlMs: config.ttlMs,
      timeoutMs: config.storeTimeoutMs,
    };
    const startMs = performance.now();
    const result = await guard(store.claim(claim), startMs);
    const claimedMs = performance.now();
    switch (result.outcome) {
      case 'acquired':
        if (emit) {
          const { key, scope } = claim;
          emit({ type: 'resumed', key, scope, finishedSteps: result.steps?.length ?? 0 });
        }
        return runLeased(
          claim,
          result.token,
          (ctx) => run(ctx, request),
          claimedMs - startMs,
          claimedMs,
          undefined,
          result.steps,
          undefined,
        );
      case 'replay':
        return replayOrError(result.response, claim, claimedMs - startMs, undefined);
      case 'mismatch':
        return conflictOf(claim, claimedMs - startMs);
      case 'in_progress':
        return { kind: 'rejected', error: inProgress(claim.key, result.retryAfterMs) };
    }
  }

  return {
    mode,
    keyHeader: config.keyHeader,
    resume,
    maxBodyBytes: config.maxBodyBytes,
    maxResponseBytes: config.maxResponseBytes,
    handle,
    render: (error) => render(config, error),
    answerHeaders: (key) => answerHeaders(config, key),
    // Every adapter makes this error once per oversized request, guarded or not yet known to be.
    bodyTooLarge: () => {
      const error = bodyTooLarge(config);
      if (emit) emit({ type: 'rejected', reason: 'body_too_large' });
      return error;
    },
    collect: () => new ResponseCollector(config.maxResponseBytes, overflow, config.storedHeaderNames),
  };
}
