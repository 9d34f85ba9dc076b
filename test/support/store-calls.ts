import type { ClaimInput, IdempotencyStore, StoredResponse } from '../../src/core/contract/index.js';

/** A claim of `key` in scope `s`: a 10 s lease unless given, and a minute's retention. */
export function claimInput(key: string, fingerprint = 'f1', leaseMs = 10_000): ClaimInput {
  return { scope: 's', key, fingerprint, leaseMs, retainMs: 60_000 };
}

/** A `text/plain` answer of `text` to complete a claim with. */
export function textResponse(text: string, status = 201): StoredResponse {
  return { status, headers: { 'content-type': 'text/plain' }, body: new TextEncoder().encode(text) };
}

/** Every key `store.list` shows in `scope`, read page by page (`limit` records a page). */
export async function listAllKeys(store: IdempotencyStore, scope: string, limit: number): Promise<string[]> {
  const keys: string[] = [];
  let after: string | undefined;
  do {
    const page = await store.list({ scope, limit, after });
    keys.push(...page.records.map((record) => record.key));
    after = page.next ?? undefined;
  } while (after);
  return keys;
}

export { expectWaitWokenBy } from '../../src/testing/wait.js';
