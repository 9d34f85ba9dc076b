import { randomUUID } from 'node:crypto';

export const DEFAULT_PURGE_BATCH_SIZE = 1000;

/** Length-prefixed so that no two (scope, key) pairs share an id, whatever characters they hold. */
export function recordId(scope: string, key: string): string {
  return `${scope.length}:${scope}${key}`;
}

export function newToken(): string {
  return randomUUID();
}

/**
 * A record must outlive its lease: were retention shorter, the record would read as absent while
 * its owner still runs, and a retry would run the handler a second time.
 */
export function expiresAtMs(nowMs: number, leaseMs: number, ttlMs: number): number {
  return nowMs + Math.max(leaseMs, ttlMs);
}

export function requirePositiveInteger(owner: string, option: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw new RangeError(`${owner}: \`${option}\` must be a positive integer, got ${String(value)}`);
  }
  return value;
}

export function yieldToEventLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * In-process wake-ups for `wait`, keyed by record id. Every waiter removes itself when it is woken
 * or times out, so the map holds only waiters that are still pending.
 */
export class Waiters {
  readonly #byId = new Map<string, Set<() => void>>();

  /** Resolves on `wake(id)` or after `timeoutMs`, whichever comes first. */
  sleep(id: string, timeoutMs: number): Promise<void> {
    return new Promise((resolve) => {
      let set = this.#byId.get(id);
      if (!set) {
        set = new Set();
        this.#byId.set(id, set);
      }
      const waiters = set;
      const done = () => {
        clearTimeout(timer);
        waiters.delete(done);
        if (waiters.size === 0 && this.#byId.get(id) === waiters) this.#byId.delete(id);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, timeoutMs));
      waiters.add(done);
    });
  }

  wake(id: string): void {
    const set = this.#byId.get(id);
    if (!set) return;
    for (const done of [...set]) done();
  }

  wakeAll(): void {
    for (const id of [...this.#byId.keys()]) this.wake(id);
  }

  /** Pending waiters, all ids together. */
  get size(): number {
    let total = 0;
    for (const set of this.#byId.values()) total += set.size;
    return total;
  }
}
