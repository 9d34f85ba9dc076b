import type { Waiters } from './internal.js';

/**
 * Polling backs up the notifications (LISTEN/NOTIFY, pub/sub), which are lost while the listening
 * connection is down or not yet listening: start quick, since a short handler finishes within tens
 * of ms, and back off to one query a second for a long one.
 */
const FIRST_POLL_MS = 25;
const MAX_POLL_MS = 1000;

/**
 * Resolves once `leaseLeftMs` reports the record is no longer in progress (`null`) or `timeoutMs`
 * has passed. A notification on `waiters` for `id` cuts the current sleep short.
 */
export async function pollUntilSettled(
  waiters: Waiters,
  id: string,
  timeoutMs: number,
  leaseLeftMs: () => Promise<number | null>,
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (let pollMs = FIRST_POLL_MS; ; pollMs = Math.min(pollMs * 2, MAX_POLL_MS)) {
    const leaseMs = await leaseLeftMs();
    const timeLeftMs = deadline - performance.now();
    if (leaseMs === null || timeLeftMs <= 0) return;
    await waiters.sleep(id, Math.max(1, Math.min(pollMs, leaseMs, timeLeftMs)));
  }
}
