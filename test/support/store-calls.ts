import type { ClaimInput, StoredResponse } from '../../src/core/contract/index.js';

/** A claim of `key` in scope `s`: a 10 s lease unless given, and a minute's retention. */
export function claimInput(key: string, fingerprint = 'f1', leaseMs = 10_000): ClaimInput {
  return { scope: 's', key, fingerprint, leaseMs, retainMs: 60_000 };
}

/** A `text/plain` answer of `text` to complete a claim with. */
export function textResponse(text: string, status = 201): StoredResponse {
  return { status, headers: { 'content-type': 'text/plain' }, body: new TextEncoder().encode(text) };
}
