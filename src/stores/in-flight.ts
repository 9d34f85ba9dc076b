import { timerMs } from '../core/options/index.js';
import type { AtomicResult, ClaimInput, StoredResponse } from '../core/store.js';

interface Settled {
  fingerprint: string;
  response: StoredResponse;
}

/**
 * An atomic claim that timed out behind an uncommitted duplicate (in this process or on the
 * database's row lock) cannot read that duplicate's lease; this is the retry hint it answers with
 * instead.
 */
export const BLOCKED_RETRY_AFTER_MS = 1000;

const TIMED_OUT = Symbol('timed out');

/** `promise`'s value, or TIMED_OUT once `ms` have passed first. */
function within<T>(promise: Promise<T>, ms: number): Promise<T | typeof TIMED_OUT> {
  if (ms <= 0) return Promise.resolve(TIMED_OUT);
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    promise,
    new Promise<typeof TIMED_OUT>((resolve) => {
      timer = setTimeout(resolve, timerMs(ms), TIMED_OUT);
    }),
  ]).finally(() => clearTimeout(timer));
}

/**
 * Atomic calls running in this process, by key: a duplicate waits here for the one ahead of it
 * instead of queueing for a pool connection, which a hot key would exhaust (queued past the pool's
 * connect timeout, duplicates failed). It settles with what a duplicate would read back: the
 * committed (or replayed) fingerprint and response, or nothing when nothing was committed.
 *
 * `run` gets the time left of the caller's `waitMs` for its own wait on the database; a duplicate
 * that outwaits the one ahead answers `in_progress` with BLOCKED_RETRY_AFTER_MS.
 */
export function atomicInFlight() {
  const inFlight = new Map<string, Promise<Settled | undefined>>();
  return async function deduplicated(
    input: ClaimInput,
    run: (waitMs: number) => Promise<AtomicResult>,
  ): Promise<AtomicResult> {
    // A key cannot hold a NUL byte, so the first one ends it.
    const id = `${input.key}\0${input.scope}`;
    const deadline = Date.now() + (input.waitMs ?? input.leaseMs);
    for (let ahead = inFlight.get(id); ahead; ahead = inFlight.get(id)) {
      const settled = await within(ahead, deadline - Date.now());
      if (settled === TIMED_OUT) return { outcome: 'in_progress', retryAfterMs: BLOCKED_RETRY_AFTER_MS };
      if (settled) {
        return settled.fingerprint === input.fingerprint
          ? { outcome: 'replay', response: settled.response }
          : { outcome: 'mismatch' };
      }
    }
    let settle!: (settled: Settled | undefined) => void;
    inFlight.set(id, new Promise((resolve) => (settle = resolve)));
    let settled: Settled | undefined;
    try {
      const result = await run(Math.max(0, deadline - Date.now()));
      if (result.outcome === 'replay' || (result.outcome === 'executed' && result.committed)) {
        settled = { fingerprint: input.fingerprint, response: result.response };
      }
      return result;
    } finally {
      inFlight.delete(id);
      settle(settled);
    }
  };
}
