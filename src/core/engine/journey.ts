import type {
  AbandonedRecord,
  AtomicResult,
  AtomicStore,
  ClaimInput,
  ClaimResult,
  ReleasedEvent,
  StoredResponse,
  TransactionEndedError,
} from '../contract/index.js';
import {
  ErrorCode,
  IdempotencyError,
  isIdempotencyError,
  isStepFenced,
  isTransactionEnded,
} from '../contract/index.js';
import {
  fingerprint,
  type IncomingRequest,
  parseIdempotencyKey,
  type RequestBody,
} from '../request/index.js';
import type { CapturedResponse } from '../response/index.js';
import {
  bodyTooLarge,
  keyInvalid,
  keyMissing,
  MAX_WAIT_SLICE_MS,
  operationAbandoned,
  render,
  replayUnreadable,
  responseTooLarge,
  storeDown,
  toStored,
} from '../response/index.js';
import type { IdempotencyContext, Outcome, ResumedRequest } from './adapter-contract.js';
import { untilAborted } from './deadline.js';
import { Journey, type Run, rejected } from './journey-state.js';
import { claimInput, type Engine } from './state.js';
import { atomicSteps, handlerContext, leasedSteps, resumeStep, resumesOf } from './steps.js';

// One keyed request's journey, in reading order: the adapter's request becomes a claim (`prepare`),
// the claim loop asks the store (`execute`), `interpret` says what the store's answer means, and
// lease mode (`runLeased`), atomic mode (`runAtomic`) or the completer (`resume`) carry it to its
// stored answer. What one request knows travels in its `Journey` (journey-state.ts), which also
// builds every event the request reports.

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

/** A claim that found the key held by a live owner; the journey waits for it or answers 409. */
type Held = Extract<ClaimResult, { outcome: 'in_progress' }>;

const PASS: Outcome = Object.freeze({ kind: 'pass' });

// A request's way to its claim: the key, the body, the scope. Each of them the adapter or an
// option may answer later (a promise); a request that waits for none is prepared in the same
// turn, so the claim loop's async call is the only one on the way.

export function prepare<Req>(
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
  const { method, path, contentType } = request;
  const prepared = (scope: string): Prepared => ({
    claim: claimInput(
      engine,
      scope,
      key,
      fingerprint({ method, path, contentType, body }, config.fingerprintBody),
    ),
    acceptEncoding: request.acceptEncoding,
    encodeRequest: () =>
      engine.codec.encodeRequest({ method, path, contentType, body: bytes, route: config.route }),
  });
  const scoped = config.scopeOf(request);
  return typeof scoped === 'string' ? prepared(scoped) : scoped.then(prepared);
}

/**
 * The state machine past the key: claims it (lease or atomic mode), runs `run` once it is held,
 * waits for or rejects a concurrent owner, replays a saved answer. HTTP requests and `idempotent`
 * runs both come here with what makes their claim: `preparing` runs inside this one async call (so
 * it costs the caller no async layer of its own), and answers at once unless it has something to
 * wait for.
 */
export async function execute<Req, Tx>(
  engine: Engine<Req>,
  preparing: () => Prepared | Promise<Prepared>,
  run: Run<Tx>,
): Promise<Outcome> {
  const ready = preparing();
  const prepared = ready instanceof Promise ? await ready : ready;
  if ('kind' in prepared) return prepared;
  const j = new Journey<Req, Tx>(
    engine,
    prepared.claim,
    run,
    prepared.acceptEncoding,
    prepared.encodeRequest,
  );
  const refused = j.refusal();
  if (refused) return refused;
  const { config, emit, guard } = engine;
  const { store, mode } = config;
  const { claim } = j;
  const deadlineMs = j.calledMs + (config.concurrency === 'wait' ? config.waitMs : 0);
  for (;;) {
    let answer: Outcome | Held;
    if (mode === 'atomic') {
      // A duplicate's claim waits on the original's open transaction: within `wait`.
      answer = await runAtomic(j, Math.max(0, deadlineMs - j.calledMs));
    } else {
      let result: ClaimResult;
      const claiming = store.claim(claim);
      try {
        result = await guard(claiming, j.calledMs);
      } catch (error) {
        return claimFailed(j, claiming, error);
      }
      j.storeAnswered();
      j.acquiredMs = performance.now();
      j.storeMs += j.acquiredMs - j.calledMs;
      const interpreted = interpret(j, result);
      // Awaited: an async call's promise returned as it is costs two more turns to adopt.
      if (interpreted instanceof Promise) return await interpreted;
      answer = interpreted;
    }
    if ('kind' in answer) return answer;
    const nowMs = performance.now();
    if (emit) j.waitingSinceMs ??= nowMs;
    const remainingMs = deadlineMs - nowMs;
    if (remainingMs <= 0) {
      j.waited('in_progress');
      return j.busy(answer.retryAfterMs);
    }
    try {
      await store.wait(
        claim.scope,
        claim.key,
        Math.min(remainingMs, answer.retryAfterMs + 1, MAX_WAIT_SLICE_MS),
      );
    } catch (error) {
      j.storeFailed('wait', error);
      j.waited('store_error');
      return { kind: 'rejected', error: storeDown(error, claim.key) };
    }
    j.calledMs = performance.now();
  }
}

/**
 * What the store's answer to a claim means, for every claim a journey makes: its request's first
 * and later attempts, a late answer's, the completer's, and atomic mode's (whose `executed` is a
 * claim acquired and run in one call). A key held by a live owner is left to the caller, which
 * waits for it or answers 409.
 */
function interpret<Req, Tx>(
  j: Journey<Req, Tx>,
  result: ClaimResult | AtomicResult,
): Outcome | Promise<Outcome> | Held {
  switch (result.outcome) {
    case 'acquired':
      j.waited('acquired');
      j.token = result.token;
      j.finished = result.steps;
      if (j.errand === 'late') return saveLate(j);
      return j.errand === 'resume' ? takeOver(j) : runLeased(j);
    case 'executed':
      j.waited('acquired');
      return atomicExecuted(j, result.committed);
    case 'replay':
      j.waited('replayed');
      return j.replay(result.response);
    case 'mismatch':
      j.waited('conflict');
      return j.conflict();
    case 'in_progress':
      return result;
  }
}

/** `interpret` for a claim that does not wait (a late answer's, the completer's): a held key is 409. */
function interpretNow<Req, Tx>(j: Journey<Req, Tx>, result: ClaimResult): Outcome | Promise<Outcome> {
  const answer = interpret(j, result);
  return answer instanceof Promise || 'kind' in answer ? answer : j.busy(answer.retryAfterMs);
}

/**
 * A lease-mode claim failed or timed out: 503. The client is told nothing ran, so a claim that
 * still lands after the timeout must not hold the key for a whole lease: it lets go as soon as it
 * answers. A takeover that got finished steps back only ends its lease: a release would delete
 * them, and the next retry would run them again (a second charge).
 */
function claimFailed<Req, Tx>(j: Journey<Req, Tx>, claiming: Promise<ClaimResult>, error: unknown): Outcome {
  const { store } = j.engine.config;
  const { scope, key } = j.claim;
  j.storeFailed('claim', error);
  j.waited('store_error');
  claiming
    .then(
      (late) => {
        if (late.outcome !== 'acquired') return;
        return late.steps?.length
          ? store.renew(scope, key, late.token, 1)
          : store.release(scope, key, late.token);
      },
      () => undefined,
    )
    .catch(() => undefined);
  return { kind: 'rejected', error: storeDown(error, key) };
}

// Lease mode: the key is held while the handler runs (renewed by the engine's lease keeper), then
// the response is saved, or the key freed.

/** Runs the handler on a held key, then saves its response or frees the key. */
async function runLeased<Req, Tx>(j: Journey<Req, Tx>): Promise<Outcome> {
  const { engine, claim } = j;
  const { config, emit, guard, leases } = engine;
  const { store, leaseMs, storeStatus } = config;
  if (j.finished?.length) {
    try {
      for (const step of j.finished) engine.codec.decodeValue(step.value);
    } catch (cause) {
      return unreadableSteps(j, cause);
    }
  }
  const lease = leases.hold(claim.scope, claim.key, j.token, j.acquiredMs);
  const steps = leasedSteps<Req, Tx>(j);
  let response: CapturedResponse;
  try {
    response = await j.run(handlerContext<Tx>(claim, undefined, steps));
  } catch (error) {
    const renewing = leases.drop(lease);
    // A step's save was refused: the request that took the key over answers for it.
    if (isStepFenced(error)) return j.busy(leaseMs);
    // The handler failed: free the key so the client's retry runs again, then let the
    // framework answer the error as it would without us.
    if (emit) j.handlerMs = performance.now() - j.acquiredMs;
    await release(j, steps.hasFinished(), 'handler_threw', renewing);
    throw error;
  }
  const renewing = leases.drop(lease);
  j.response = response;
  const handlerEndMs = performance.now();
  j.handlerMs = handlerEndMs - j.acquiredMs;
  // A 4xx the handler chose after a step finished is its final answer: released, the operation
  // would be resumed (and its steps replayed) for ever, and the key cannot be freed without
  // losing what the steps did.
  const final = response.status >= 400 && response.status < 500 && steps.hasFinished();
  if (!response.complete || !(storeStatus(response.status) || final)) {
    const reason = response.complete ? 'not_stored' : 'response_too_large';
    await release(j, steps.hasFinished(), reason, renewing);
    return { kind: 'executed', response };
  }
  const stored = toStored(config, response);
  // A failed save leaves the record in progress until its lease passes: retries wait or get
  // 409 rather than running the work a second time while this response is on its way.
  let saved: boolean | undefined;
  try {
    saved = await guard(store.complete(claim.scope, claim.key, j.token, stored), handlerEndMs);
  } catch (error) {
    saved = j.storeFailed('complete', error);
  }
  if (emit) j.storeMs += performance.now() - handlerEndMs;
  if (saved === false) return answerLate(j, stored);
  j.executed(response.status);
  return { kind: 'executed', response };
}

/**
 * Frees the key after the handler answered (or threw) and reports why. An operation with finished
 * steps keeps its record (a release would lose them): its lease is ended instead, so the retry,
 * or the completer, takes it over and resumes at the next step.
 */
async function release<Req, Tx>(
  j: Journey<Req, Tx>,
  keepSteps: boolean,
  reason: ReleasedEvent['reason'],
  renewing: Promise<void> | undefined,
): Promise<void> {
  const { config, emit, guard } = j.engine;
  const { scope, key } = j.claim;
  // A renewal landing after the lease was ended would hold the key for another lease.
  if (keepSteps && renewing) await renewing;
  const startMs = performance.now();
  let released: boolean | undefined;
  try {
    const freeing = keepSteps
      ? config.store.renew(scope, key, j.token, 1)
      : config.store.release(scope, key, j.token);
    released = await guard(freeing, startMs);
  } catch (error) {
    j.storeFailed('release', error);
  }
  if (!emit) return;
  if (released === false) j.fenced('release');
  j.storeMs += performance.now() - startMs;
  j.released(reason, j.response?.status);
}

/**
 * The finished steps of a takeover were sealed with a key no longer in `encryptionKey`: the
 * handler cannot go on without their results and must not run them again (a second charge), so
 * the operation keeps them, its lease is ended, and the request is answered as a saved answer no
 * key opens is (500 `replay_unreadable`, a `rejected` event), until a key that opens them is back
 * or retention passes.
 */
async function unreadableSteps<Req, Tx>(j: Journey<Req, Tx>, cause: unknown): Promise<Outcome> {
  const { config, guard } = j.engine;
  try {
    await guard(config.store.renew(j.claim.scope, j.claim.key, j.token, 1), performance.now());
  } catch (error) {
    j.storeFailed('release', error);
  }
  return j.rejected(replayUnreadable(cause, j.claim.key), 'replay_unreadable');
}

/**
 * The handler finished after another request took its key over, so its response was not saved
 * and must not be sent as if it were: the client gets the answer saved for the key when there
 * is one, 409 + Retry-After while the other request runs, and this response only once it is
 * saved (when nothing else was).
 */
async function answerLate<Req, Tx>(j: Journey<Req, Tx>, stored: StoredResponse): Promise<Outcome> {
  const { config, emit, guard } = j.engine;
  j.fenced('complete');
  j.errand = 'late';
  j.stored = stored;
  j.calledMs = performance.now();
  let result: ClaimResult;
  try {
    result = await guard(config.store.claim(j.claim), j.calledMs);
  } catch (error) {
    j.storeFailed('claim', error);
    return j.busy(config.leaseMs);
  }
  if (emit) j.storeMs += performance.now() - j.calledMs;
  return interpretNow(j, result);
}

/** A late answer's claim acquired the key: nothing else was saved for it, so this response is. */
async function saveLate<Req, Tx>(j: Journey<Req, Tx>): Promise<Outcome> {
  const { config, emit, guard } = j.engine;
  const { scope, key } = j.claim;
  const startMs = performance.now();
  const saved = await guard(config.store.complete(scope, key, j.token, j.stored!), startMs).catch(
    (error) => j.storeFailed('complete', error) ?? false,
  );
  if (!saved) return j.busy(config.leaseMs);
  if (emit) j.storeMs += performance.now() - startMs;
  j.executed(j.response!.status);
  return { kind: 'executed', response: j.response! };
}

// Atomic mode: the claim, the handler's writes and its saved response are one store transaction,
// which commits them together or rolls them all back.

/** Claims the key and runs the handler in one store transaction; a held key is the caller's to wait for. */
async function runAtomic<Req, Tx>(j: Journey<Req, Tx>, waitMs: number): Promise<Outcome | Held> {
  const { engine, claim } = j;
  const { config, emit } = engine;
  const { store, storeStatus } = config;
  let handlerFailed = false;
  let handlerError: unknown;
  let result: AtomicResult;
  try {
    result = await (store as AtomicStore<Tx>).atomic({ ...claim, waitMs }, async (tx) => {
      const handlerStartMs = emit ? performance.now() : 0;
      let captured: CapturedResponse;
      try {
        captured = await j.run(handlerContext(claim, tx, atomicSteps(tx)));
      } catch (error) {
        handlerFailed = true;
        handlerError = error;
        throw error;
      } finally {
        if (emit) j.handlerMs = performance.now() - handlerStartMs;
      }
      j.response = captured;
      // Nothing may reach the client before the commit, so an oversized response cannot be
      // streamed: everything is rolled back, and the answer says why.
      return {
        response: toStored(config, captured),
        commit: captured.complete && storeStatus(captured.status),
      };
    });
  } catch (error) {
    if (emit) j.storeMs += performance.now() - j.calledMs - j.handlerMs;
    if (isTransactionEnded(error)) {
      const outcome = transactionEnded(j, error);
      j.waited('acquired');
      return outcome;
    }
    if (handlerFailed) {
      j.storeAnswered();
      j.released('handler_threw', undefined);
      j.waited('acquired');
      throw handlerError;
    }
    j.storeFailed('atomic', error);
    j.waited('store_error');
    return { kind: 'rejected', error: storeDown(error, claim.key) };
  }
  j.storeAnswered();
  if (emit) j.storeMs += performance.now() - j.calledMs - j.handlerMs;
  return interpret(j, result);
}

/** The handler's transaction ran: committed (its answer saved), or rolled back (not storable). */
function atomicExecuted<Req, Tx>(j: Journey<Req, Tx>, committed: boolean): Outcome {
  const response = j.response!;
  const { status, complete } = response;
  if (committed) j.executed(status);
  else j.released(complete ? 'not_stored' : 'response_too_large', status);
  if (!complete) return { kind: 'rejected', error: responseTooLarge(j.engine.config, j.claim.key) };
  return { kind: 'executed', response };
}

/**
 * The handler ended the transaction itself: said loudly (an event and a logged error naming the
 * fix, since a listener may be absent), and answered 500. The store kept that answer on the key.
 */
function transactionEnded<Req, Tx>(j: Journey<Req, Tx>, error: TransactionEndedError): Outcome {
  j.transactionEnded(error);
  console.error(`retrysafe: ${error.message}`);
  const { key } = j.claim;
  return {
    kind: 'rejected',
    error: new IdempotencyError(500, ErrorCode.transactionEnded, error.message, {}, key, { cause: error }),
  };
}

// The completer: an abandoned operation (lease passed, a request saved with its first step) is
// claimed with the normal fencing and re-driven from its saved request, at its first unfinished step.

/** `Idempotency.resume`: `undefined` when the saved request cannot be read here (another route). */
export async function resume<Req, Tx>(
  engine: Engine<Req>,
  record: AbandonedRecord,
  run: (ctx: IdempotencyContext<Tx>, request: ResumedRequest) => Promise<CapturedResponse>,
  signal: AbortSignal | undefined,
): Promise<Outcome | undefined> {
  const { config, guard } = engine;
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
  // Once `signal` aborts the run counts as failed: its lease is ended (its steps kept) for a later
  // pass, whatever the handler still does.
  const driven: Run<Tx> = signal
    ? (ctx) => Promise.race([run(ctx, request), untilAborted(signal)])
    : (ctx) => run(ctx, request);
  const j = new Journey<Req, Tx>(engine, claim, driven, undefined, undefined);
  j.errand = 'resume';
  const result = await guard(config.store.claim(claim), j.calledMs);
  j.acquiredMs = performance.now();
  j.storeMs = j.acquiredMs - j.calledMs;
  return await interpretNow(j, result);
}

/**
 * The completer acquired an abandoned operation: counted as a resume on its record before the
 * handler runs (so a resume that crashes counts too), then run at its first unfinished step; past
 * `maxResumes` given up instead.
 */
async function takeOver<Req, Tx>(j: Journey<Req, Tx>): Promise<Outcome> {
  const { config, guard, codec } = j.engine;
  const { scope, key } = j.claim;
  const finished = j.finished ?? [];
  const resumes = resumesOf(finished);
  if (resumes >= config.maxResumes) return giveUp(j, resumes);
  const counted = resumeStep(resumes + 1, codec.encodeText(''));
  let saved: boolean;
  try {
    saved = await guard(config.store.saveStep(scope, key, j.token, counted), performance.now());
  } catch (error) {
    j.storeFailed('step', error);
    return { kind: 'rejected', error: storeDown(error, key) };
  }
  if (!saved) return j.busy(config.leaseMs);
  j.resumed(finished.length - resumes);
  j.finished = [...finished, counted];
  return await runLeased(j);
}

/**
 * Ends an operation the completer took over `resumes` times (`maxResumes`): its final answer,
 * 500 `operation_abandoned`, is saved for every retry to replay, instead of running its handler
 * once more; a `gave_up` event says so.
 */
async function giveUp<Req, Tx>(j: Journey<Req, Tx>, resumes: number): Promise<Outcome> {
  const { config, guard } = j.engine;
  const { key, scope } = j.claim;
  const error = operationAbandoned(key, resumes);
  let saved: boolean;
  try {
    const answer = toStored(config, render(config, error));
    saved = await guard(config.store.complete(scope, key, j.token, answer), performance.now());
  } catch (cause) {
    j.storeFailed('complete', cause);
    return { kind: 'rejected', error: storeDown(cause, key) };
  }
  if (!saved) return j.busy(config.leaseMs);
  j.gaveUp(resumes);
  return { kind: 'rejected', error };
}
