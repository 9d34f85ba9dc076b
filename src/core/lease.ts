import type { IdempotencyStore } from './types.js';

interface HeldLease {
  scope: string;
  key: string;
  token: string;
  renewAtMs: number;
}

/**
 * Renews the leases of running handlers, so a live handler never loses its claim and a crashed
 * one (whose renewals die with it) frees its key within one lease. One unref'd timer serves every
 * held lease (armed only while leases are held), as in `deadlineGuard`. Each lease is renewed
 * every third of its length, whether or not the previous renewal has answered, so a renewal lost
 * or stuck on a slow store is followed by another before the lease runs out. A renewal answered
 * `false` means the lease was lost (another request took the key over): it is renewed no more.
 */
export function leaseKeeper(store: IdempotencyStore, leaseMs: number) {
  const renewEveryMs = Math.max(1, Math.floor(leaseMs / 3));
  const held = new Set<HeldLease>();
  let ticker: NodeJS.Timeout | undefined;
  const tick = () => {
    const now = Date.now();
    for (const lease of held) {
      if (lease.renewAtMs > now) continue;
      lease.renewAtMs = now + renewEveryMs;
      // A failed renewal is simply sent again when the next one is due.
      Promise.resolve()
        .then(() => store.renew(lease.scope, lease.key, lease.token, leaseMs))
        .then(
          (renewed) => {
            if (!renewed) held.delete(lease);
          },
          () => undefined,
        );
    }
    if (held.size === 0) {
      clearInterval(ticker);
      ticker = undefined;
    }
  };
  return {
    hold(scope: string, key: string, token: string): HeldLease {
      const lease = { scope, key, token, renewAtMs: Date.now() + renewEveryMs };
      held.add(lease);
      if (!ticker) {
        ticker = setInterval(tick, Math.max(1, Math.floor(renewEveryMs / 4)));
        ticker.unref();
      }
      return lease;
    },
    drop(lease: HeldLease): void {
      held.delete(lease);
    },
  };
}

/**
 * A handler finished after another request took its key over, so the work may have run twice.
 * A log line until the engine has an event hook.
 */
export function reportLostLease(storeName: string, key: string, step: 'complete' | 'release'): void {
  console.warn(
    `retrysafe: the lease on Idempotency-Key ${JSON.stringify(key)} (${storeName} store) was lost while its handler ran; another request took the key over, so its ${step} was refused and the handler may have run twice`,
  );
}
