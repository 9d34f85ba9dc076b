import type { Waiters } from './internal.js';

/**
 * Polling backs up the notifications (LISTEN/NOTIFY, pub/sub), which are lost while the listening
 * connection is down or not yet listening: start quick, since a short handler finishes within tens
 * of ms, and back off to one query a second for a long one.
 */
const FIRST_POLL_MS = 25;
const MAX_POLL_MS = 1000;

/** The first delay between polls, doubled after each poll up to the last. */
export interface PollDelays {
  firstPollMs: number;
  maxPollMs: number;
}

/**
 * Resolves once `leaseLeftMs` reports the record is no longer in progress (`null`) or `timeoutMs`
 * has passed. A notification on `waiters` for `id` cuts the current sleep short.
 */
export async function pollUntilSettled(
  waiters: Waiters,
  id: string,
  timeoutMs: number,
  leaseLeftMs: () => Promise<number | null>,
  { firstPollMs, maxPollMs }: PollDelays = { firstPollMs: FIRST_POLL_MS, maxPollMs: MAX_POLL_MS },
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (let pollMs = firstPollMs; ; pollMs = Math.min(pollMs * 2, maxPollMs)) {
    const leaseMs = await leaseLeftMs();
    const timeLeftMs = deadline - performance.now();
    if (leaseMs === null || timeLeftMs <= 0) return;
    await waiters.sleep(id, Math.max(1, Math.min(pollMs, leaseMs, timeLeftMs)));
  }
}
