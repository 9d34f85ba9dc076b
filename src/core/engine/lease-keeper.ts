import type { IdempotencyEventListener, IdempotencyStore } from '../contract/index.js';
import { timerMs, unrefTimer } from '../options/index.js';

interface HeldLease {
  scope: string;
  key: string;
  token: string;
  renewAtMs: number;
  /** The renewal on its way to the store, if any (it never rejects). */
  renewing?: Promise<void>;
}

/**
 * Renews the leases of running handlers, so a live handler never loses its claim and a crashed
 * one (whose renewals die with it) frees its key within one lease. One unref'd timer serves every
 * held lease (armed only while leases are held), as in `deadlineGuard`. Each lease is renewed
 * every third of its length, whether or not the previous renewal has answered, so a renewal lost
 * or stuck on a slow store is followed by another before the lease runs out. A renewal answered
 * `false` means the lease was lost (another request took the key over): it is renewed no more.
 * Times are on `performance.now()`'s clock; `hold` takes the time the lease was claimed, which
 * the engine has just read.
 */
export function leaseKeeper(
  store: IdempotencyStore,
  leaseMs: number,
  emit: IdempotencyEventListener | undefined,
) {
  const renewEveryMs = Math.max(1, Math.floor(leaseMs / 3));
  const held = new Set<HeldLease>();
  let ticker: NodeJS.Timeout | undefined;
  const tick = () => {
    const now = performance.now();
    for (const lease of held) {
      if (lease.renewAtMs > now) continue;
      lease.renewAtMs = now + renewEveryMs;
      // A failed renewal is simply sent again when the next one is due.
      lease.renewing = Promise.resolve()
        .then(() => store.renew(lease.scope, lease.key, lease.token, leaseMs))
        .then(
          (renewed) => {
            if (!renewed) held.delete(lease);
            if (emit)
              emit({ type: renewed ? 'lease_renewed' : 'lease_lost', key: lease.key, scope: lease.scope });
          },
          (error: unknown) => {
            if (emit)
              emit({ type: 'store_error', operation: 'renew', key: lease.key, scope: lease.scope, error });
          },
        );
    }
    if (held.size === 0) {
      clearInterval(ticker);
      ticker = undefined;
    }
  };
  return {
    hold(scope: string, key: string, token: string, claimedMs: number): HeldLease {
      const lease = { scope, key, token, renewAtMs: claimedMs + renewEveryMs };
      held.add(lease);
      if (!ticker) {
        ticker = setInterval(tick, timerMs(Math.max(1, Math.floor(renewEveryMs / 4))));
        unrefTimer(ticker);
      }
      return lease;
    },
    /**
     * Renews `lease` no more. Resolves once a renewal already on its way has answered, so that a
     * write after it (ending the lease) is not undone by it.
     */
    drop(lease: HeldLease): Promise<void> | undefined {
      held.delete(lease);
      return lease.renewing;
    },
  };
}
