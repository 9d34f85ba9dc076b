import { createHash } from 'node:crypto';
import type { ClaimInput } from '../contract/index.js';
import type { IdempotencyContext } from './adapter-contract.js';

/** What the handler is told about its request; `tx` is the atomic store's transaction. */
export function handlerContext<Tx>(claim: ClaimInput, tx: Tx | undefined): IdempotencyContext<Tx> {
  return {
    key: claim.key,
    scope: claim.scope,
    fingerprint: claim.fingerprint,
    tx,
    downstreamKey: (purpose) =>
      createHash('sha256').update(`${claim.scope}\n${claim.key}\n${purpose}`).digest('base64url'),
  };
}
