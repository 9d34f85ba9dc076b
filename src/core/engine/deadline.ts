import { RetrysafeError } from '../contract/index.js';
import { timerMs, unrefTimer } from '../options/index.js';

/**
 * Rejects promises still pending after `timeoutMs`. One unref'd sweep timer serves every pending
 * call (armed only while calls are pending): a timer per store call cost more than the call itself.
 * Times are on `performance.now()`'s clock; the caller passes when the call was made, as it has
 * usually just read the clock to time the call (a read costs as much as the rest of `guard`).
 */
export function deadlineGuard(timeoutMs: number, message: string) {
  const pending = new Set<{ deadlineMs: number; reject: (error: Error) => void }>();
  let sweeper: NodeJS.Timeout | undefined;
  const sweep = () => {
    const now = performance.now();
    for (const call of pending) {
      if (call.deadlineMs <= now) {
        pending.delete(call);
        call.reject(new RetrysafeError(message));
      }
    }
    if (pending.size === 0) {
      clearInterval(sweeper);
      sweeper = undefined;
    }
  };
  return function guard<T>(promise: Promise<T>, calledMs: number): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const call = { deadlineMs: calledMs + timeoutMs, reject };
      pending.add(call);
      if (!sweeper) {
        sweeper = setInterval(sweep, timerMs(Math.max(1, Math.min(100, Math.floor(timeoutMs / 4)))));
        unrefTimer(sweeper);
      }
      promise.then(
        (value) => {
          pending.delete(call);
          resolve(value);
        },
        (error) => {
          pending.delete(call);
          reject(error);
        },
      );
    });
  };
}

/** Rejects with `signal`'s reason once it aborts (at once if it has): a bound to race work against. */
export function untilAborted(signal: AbortSignal): Promise<never> {
  return new Promise<never>((_, reject) => {
    if (signal.aborted) reject(signal.reason);
    else signal.addEventListener('abort', () => reject(signal.reason), { once: true });
  });
}
