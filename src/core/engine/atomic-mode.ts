import type { AtomicStore, ClaimInput, TransactionEndedError } from '../contract/index.js';
import { ErrorCode, IdempotencyError, isTransactionEnded } from '../contract/index.js';
import type { CapturedResponse } from '../response/index.js';
import { responseTooLarge, storeDown, toStored } from '../response/index.js';
import type { IdempotencyContext, Outcome } from './adapter-contract.js';
import { conflictOf, replayOrError, storeAnswered, storeFailed } from './outcomes.js';
import type { Engine } from './state.js';
import { atomicSteps, handlerContext } from './steps.js';

/**
 * Atomic mode's step: claims the key and runs the handler in one store transaction, which commits
 * the handler's writes with its response or rolls both back.
 */
export async function runAtomic<Req, Tx>(
  engine: Engine<Req>,
  claim: ClaimInput,
  run: (ctx: IdempotencyContext<Tx>) => Promise<CapturedResponse>,
  acceptEncoding: string | undefined,
  startMs: number,
): Promise<Outcome | { kind: 'in_progress'; retryAfterMs: number }> {
  const { config, emit } = engine;
  const { store, storeStatus } = config;
  let handlerFailed = false;
  let handlerError: unknown;
  let captured: CapturedResponse | undefined;
  let handlerMs = 0;
  // The store's share of the call: everything but the handler (claim, save, commit).
  const storeMs = () => performance.now() - startMs - handlerMs;
  try {
    const result = await (store as AtomicStore<Tx>).atomic(claim, async (tx) => {
      const handlerStartMs = emit ? performance.now() : 0;
      try {
        captured = await run(handlerContext(claim, tx, atomicSteps(tx)));
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
    storeAnswered(engine);
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
        return replayOrError(engine, result.response, claim, emit ? storeMs() : 0, acceptEncoding);
      case 'mismatch':
        return conflictOf(engine, claim, emit ? storeMs() : 0);
      case 'in_progress':
        return { kind: 'in_progress', retryAfterMs: result.retryAfterMs };
    }
  } catch (error) {
    if (isTransactionEnded(error)) return transactionEnded(engine, claim, error, handlerMs);
    if (handlerFailed) {
      storeAnswered(engine);
      if (emit) {
        const { key, scope } = claim;
        emit({ type: 'released', key, scope, reason: 'handler_threw', handlerMs, storeMs: storeMs() });
      }
      throw handlerError;
    }
    storeFailed(engine, 'atomic', claim, error);
    return { kind: 'rejected', error: storeDown(error, claim.key) };
  }
}

/**
 * The handler ended the transaction itself: said loudly (an event and a logged error naming the
 * fix, since a listener may be absent), and answered 500. The store kept that answer on the key.
 */
function transactionEnded<Req>(
  { emit }: Engine<Req>,
  claim: ClaimInput,
  error: TransactionEndedError,
  handlerMs: number,
): Outcome {
  const { key, scope } = claim;
  if (emit) emit({ type: 'transaction_ended', key, scope, handlerMs, error });
  console.error(`retrysafe: ${error.message}`);
  return {
    kind: 'rejected',
    error: new IdempotencyError(500, ErrorCode.transactionEnded, error.message, {}, key, { cause: error }),
  };
}
