import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'vitest';
import type { IdempotencyStore } from '../core/store.js';

/**
 * Starts a wait on `(scope, key)` of `store`, gives it `settleMs` to settle in, then runs `change`:
 * the wait must return after the change, not before it, nor only at its `timeoutMs` (which lies
 * beyond the test's own timeout).
 */
export async function expectWaitWokenBy(
  store: IdempotencyStore,
  scope: string,
  key: string,
  change: () => Promise<unknown>,
  { settleMs = 100, timeoutMs = 120_000 } = {},
): Promise<void> {
  const events: string[] = [];
  const waiting = store.wait(scope, key, timeoutMs).then(() => events.push('woke'));
  await sleep(settleMs);
  events.push('changed');
  await change();
  await waiting;
  expect(events).toEqual(['changed', 'woke']);
}
