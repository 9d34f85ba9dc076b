import type { IdempotencyStore } from '../contract/index.js';
import type { BreakerSettings } from '../options/index.js';

/** Where a store's circuit stands: `open` fails calls fast, `half_open` lets one probe through. */
export type CircuitState = 'closed' | 'open' | 'half_open';

/**
 * A circuit breaker in front of one store. After `failures` store calls in a row failed (threw or
 * outlived `storeTimeout`), requests are refused at once with 503 and `Retry-After` for
 * `cooldownMs`, instead of each waiting its own store timeout while they pile up; then one request
 * per cooldown probes the store, and the first call that succeeds closes the circuit. Any call the
 * store answers counts as a success (a replay, a conflict, a key in progress).
 */
export interface StoreBreaker {
  readonly state: CircuitState;
  /** Failed calls in a row (0 once one succeeds). */
  readonly failures: number;
  /** `undefined` when a call may go to the store now, else how long until one may. */
  refusal(nowMs: number): number | undefined;
  /** A store call answered; `true` when that closed an open circuit. */
  succeeded(): boolean;
  /** A store call failed; `true` when that opened the circuit. */
  failed(nowMs: number): boolean;
}

const breakers = new WeakMap<IdempotencyStore, Map<string, StoreBreaker>>();

/**
 * The breaker of `store`: one per store object and settings, so every route and job on one store
 * shares what it learns of it.
 */
export function breakerOf(store: IdempotencyStore, settings: BreakerSettings): StoreBreaker {
  const bySettings = breakers.get(store) ?? new Map<string, StoreBreaker>();
  breakers.set(store, bySettings);
  const id = `${settings.failures}/${settings.cooldownMs}`;
  const breaker = bySettings.get(id) ?? storeBreaker(settings);
  bySettings.set(id, breaker);
  return breaker;
}

function storeBreaker({ failures: threshold, cooldownMs }: BreakerSettings): StoreBreaker {
  let failures = 0;
  /** While the circuit is open: when the next probe may go. */
  let probeAtMs: number | undefined;
  let probing = false;
  return {
    get state() {
      if (probeAtMs === undefined) return 'closed';
      return probing ? 'half_open' : 'open';
    },
    get failures() {
      return failures;
    },
    refusal(nowMs) {
      if (probeAtMs === undefined) return undefined;
      if (nowMs < probeAtMs) return probeAtMs - nowMs;
      // This call is the probe; the next may go a cooldown later, should this one hang.
      probing = true;
      probeAtMs = nowMs + cooldownMs;
      return undefined;
    },
    succeeded() {
      failures = 0;
      if (probeAtMs === undefined) return false;
      probeAtMs = undefined;
      probing = false;
      return true;
    },
    failed(nowMs) {
      failures++;
      if (probeAtMs !== undefined) {
        probing = false;
        probeAtMs = nowMs + cooldownMs;
        return false;
      }
      if (failures < threshold) return false;
      probeAtMs = nowMs + cooldownMs;
      return true;
    },
  };
}

/**
 * The circuit of `store` as the engines on it see it, for a health check: `open` while requests
 * are refused, `half_open` while a probe is out, else `closed` (also for a store no engine uses).
 * @example
 * if (storeCircuit(store).state !== 'closed') res.writeHead(503).end();
 */
export function storeCircuit(store: IdempotencyStore): { state: CircuitState; failures: number } {
  let found: { state: CircuitState; failures: number } = { state: 'closed', failures: 0 };
  for (const breaker of breakers.get(store)?.values() ?? []) {
    if (breaker.state !== 'closed' || breaker.failures > found.failures) {
      found = { state: breaker.state, failures: breaker.failures };
      if (breaker.state === 'open') break;
    }
  }
  return found;
}
