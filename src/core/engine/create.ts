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
  operationAbandoned,
  ResponseCollector,
  render,
  replayUnreadable,
  storeDown,
  toStored,
} from '../response/index.js';
import type { Idempotency, IdempotencyContext, Outcome, ResumedRequest } from './adapter-contract.js';
import { execute, type Prepared } from './claim-loop.js';
import { untilAborted } from './deadline.js';
import { runLeased } from './lease-mode.js';
import { conflictOf, rejected, replayOrError, storeFailed } from './outcomes.js';
import { claimInput, type Engine, engineState } from './state.js';
import { resumeStep, resumesOf } from './steps.js';

const PASS: Outcome = Object.freeze({ kind: 'pass' });

/**
 * Creates the engine adapters wrap. Options are checked here, once.
 * @example
 * const idempotency = createIdempotency({ store: sqliteStore({ url: 'app.db', migrate: true }), ttl: '7d' });
 */
export function createIdempotency<Req = unknown, Tx = unknown>(
  options: IdempotencyOptions<Req, Tx>,
): Idempotency<Req, Tx> {
  const engine = engineState(resolveOptions(options));
  const { config, emit } = engine;
  const overflow = config.mode === 'lease' ? 'stream' : 'drop';
  return {
    mode: config.mode,
    keyHeader: config.keyHeader,
    maxBodyBytes: config.maxBodyBytes,
    maxResponseBytes: config.maxResponseBytes,
    resume: (record, run, signal) => resume(engine, record, run, signal),
    handle: (request, run) => execute(engine, () => prepareRequest(engine, request), run),
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

// A request's way to its claim: the key, the body, the scope. Each of them the adapter or an
// option may answer later (a promise); a request that waits for none is prepared in the same
// turn, so the claim loop's async call is the only one on the way.

function prepareRequest<Req>(
  engine: Engine<Req>,
  request: IncomingRequest<Req>,
): Prepared | Promise<Prepared> {
  const { config } = engine;
  if (!config.methods.has(request.method.toUpperCase())) return PASS;
  if (config.keyOf === undefined) return withKey(engine, request, request.keyHeader);
  const header = config.keyOf(request.raw);
  return header instanceof Promise
    ? header.then((given) => withKey(engine, request, given))
    : withKey(engine, request, header);
}

function withKey<Req>(
  engine: Engine<Req>,
  request: IncomingRequest<Req>,
  header: IncomingRequest['keyHeader'],
): Prepared | Promise<Prepared> {
  const { config } = engine;
  const parsed = parseIdempotencyKey(header, config.bounds);
  if (parsed.ok === 'absent') return config.required ? rejected(engine, keyMissing(), 'key_missing') : PASS;
  if (!parsed.ok) return rejected(engine, keyInvalid(parsed.reason), 'key_invalid');
  let read: RequestBody | Promise<RequestBody>;
  try {
    read = request.readBody();
  } catch (error) {
    return unreadBody(error);
  }
  return read instanceof Promise
    ? read.then((body) => withBody(engine, request, parsed.key, body), unreadBody)
    : withBody(engine, request, parsed.key, read);
}

/** The adapter's own refusal of the body (`bodyTooLarge`) is answered; anything else is thrown. */
function unreadBody(error: unknown): Prepared {
  if (isIdempotencyError(error)) return { kind: 'rejected', error };
  throw error;
}

function withBody<Req>(
  engine: Engine<Req>,
  request: IncomingRequest<Req>,
  key: string,
  body: RequestBody,
): Prepared | Promise<Prepared> {
  const { config } = engine;
  const bytes = body instanceof Uint8Array ? body : body.parsed;
  // A parser in front may allow more than we do: what it read is held to our limit too.
  if (bytes.byteLength > config.maxBodyBytes) return rejected(engine, bodyTooLarge(config), 'body_too_large');
  const prepared = (scope: string): Prepared => ({
    claim: claimInput(
      engine,
      scope,
      key,
      fingerprint(
        { method: request.method, path: request.path, contentType: request.contentType, body },
        config.fingerprintBody,
      ),
    ),
    acceptEncoding: request.acceptEncoding,
    encodeRequest: () =>
      engine.codec.encodeRequest({
        method: request.method,
        path: request.path,
        contentType: request.contentType,
        body: bytes,
        route: config.route,
      }),
  });
  const scoped = config.scopeOf(request);
  return typeof scoped === 'string' ? prepared(scoped) : scoped.then(prepared);
}

/**
 * Ends an operation the completer took over `resumes` times (`maxResumes`): its final answer,
 * 500 `operation_abandoned`, is saved for every retry to replay, instead of running its handler
 * once more; a `gave_up` event says so.
 */
async function giveUp<Req>(
  engine: Engine<Req>,
  claim: ClaimInput,
  token: string,
  resumes: number,
): Promise<Outcome> {
  const { config, emit, guard } = engine;
  const { key, scope } = claim;
  const error = operationAbandoned(key, resumes);
  let saved: boolean;
  try {
    const answer = toStored(config, render(config, error));
    saved = await guard(config.store.complete(scope, key, token, answer), performance.now());
  } catch (cause) {
    storeFailed(engine, 'complete', claim, cause);
    return { kind: 'rejected', error: storeDown(cause, key) };
  }
  if (!saved) return { kind: 'rejected', error: inProgress(key, config.leaseMs) };
  if (emit) emit({ type: 'gave_up', key, scope, resumes });
  return { kind: 'rejected', error };
}

async function resume<Req, Tx>(
  engine: Engine<Req>,
  record: AbandonedRecord,
  run: (ctx: IdempotencyContext<Tx>, request: ResumedRequest) => Promise<CapturedResponse>,
  signal: AbortSignal | undefined,
): Promise<Outcome | undefined> {
  const { config, emit, guard } = engine;
  if (signal?.aborted) return undefined;
  let request: ResumedRequest;
  try {
    request = engine.codec.decodeRequest(record.request, record.scope, record.key);
  } catch (cause) {
    // Sealed with a key no longer in `encryptionKey`: nothing here can finish it (a retry gets the
    // same answer), and whoever listens hears why.
    return rejected(engine, replayUnreadable(cause, record.key), 'replay_unreadable', record.scope);
  }
  // Another route's operation: only the handler that started it may finish it.
  if (request.route !== config.route) return undefined;
  const claim = claimInput(engine, record.scope, record.key, record.fingerprint);
  const startMs = performance.now();
  const result = await guard(config.store.claim(claim), startMs);
  const claimedMs = performance.now();
  switch (result.outcome) {
    case 'acquired': {
      const { key, scope } = claim;
      const finished = result.steps ?? [];
      const resumes = resumesOf(finished);
      if (resumes >= config.maxResumes) return giveUp(engine, claim, result.token, resumes);
      // Counted on the record before the handler runs, so a resume that crashes counts too.
      const counted = resumeStep(resumes + 1, engine.codec.encodeText(''));
      let saved: boolean;
      try {
        saved = await guard(config.store.saveStep(scope, key, result.token, counted), performance.now());
      } catch (error) {
        storeFailed(engine, 'step', claim, error);
        return { kind: 'rejected', error: storeDown(error, key) };
      }
      if (!saved) return { kind: 'rejected', error: inProgress(key, config.leaseMs) };
      if (emit) emit({ type: 'resumed', key, scope, finishedSteps: finished.length - resumes });
      return runLeased(
        engine,
        claim,
        result.token,
        // Once `signal` aborts the run counts as failed: its lease is ended (its steps kept) for
        // a later pass, whatever the handler still does.
        (ctx: IdempotencyContext<Tx>) =>
          signal ? Promise.race([run(ctx, request), untilAborted(signal)]) : run(ctx, request),
        claimedMs - startMs,
        claimedMs,
        undefined,
        [...finished, counted],
        undefined,
      );
    }
    case 'replay':
      return replayOrError(engine, result.response, claim, claimedMs - startMs, undefined);
    case 'mismatch':
      return conflictOf(engine, claim, claimedMs - startMs);
    case 'in_progress':
      return { kind: 'rejected', error: inProgress(claim.key, result.retryAfterMs) };
  }
}
