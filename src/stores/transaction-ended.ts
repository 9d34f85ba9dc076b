import { TransactionEndedError } from '../core/contract/index.js';
import type { StoredResponse } from '../core/store.js';

/**
 * What the record of a key keeps when its handler ended the operation's transaction itself: its
 * writes (and the claim) are committed, so a retry must never run it again; every retry replays
 * this for the key's retention.
 */
export const TRANSACTION_ENDED_RESPONSE: StoredResponse = {
  status: 500,
  headers: { 'content-type': 'application/json' },
  body: Buffer.from(
    JSON.stringify({
      error: 'transaction_ended',
      message:
        "The handler ended the operation's transaction itself (a COMMIT or ROLLBACK of its own), so its answer could not commit with its writes. What it wrote may be kept; this key is not run again.",
    }),
  ),
};

/** The error an atomic store throws once it has kept {@link TRANSACTION_ENDED_RESPONSE} on `key`. */
export function transactionEnded(owner: string, key: string, cause: unknown): TransactionEndedError {
  return new TransactionEndedError(
    `${owner}: the handler ended the operation's transaction itself (a COMMIT or ROLLBACK of its own, or an ORM transaction opened on a new wrapper of ctx.tx) before its answer was saved. Its writes may be committed; the key "${key}" now answers 500 and is not run again. Write through ctx.tx, and nest with the ORM's own nested transaction on ctx.tx (a savepoint: tx.transaction(), Prisma's tx.$transaction(async …), Kysely's tx.savepoint()).`,
    { cause },
  );
}

/** Thrown inside an atomic store when the handler ended the transaction; `cause` is its own error, if any. */
export class Ended {
  constructor(readonly cause: unknown) {}
}
