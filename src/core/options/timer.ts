/**
 * The longest delay every timer and timeout here accepts: Node's setTimeout and setInterval fire
 * at once past it (with a TimeoutOverflowWarning), and PostgreSQL's `statement_timeout` and
 * `lock_timeout` and SQLite's `busy_timeout` are 32-bit ints of ms. About 24.8 days.
 */
export const MAX_TIMER_MS = 2_147_483_647;

/**
 * `ms` as a delay for setTimeout, setInterval or an SQL timeout: whole, at least 0, at most
 * MAX_TIMER_MS. A longer bound (a 30-day lease or wait) then ends after 24.8 days instead, which
 * no request tells apart.
 */
export function timerMs(ms: number): number {
  return Math.min(MAX_TIMER_MS, Math.max(0, Math.ceil(ms)));
}

/**
 * Lets the process exit while `timer` is pending, where the runtime can (Node, Bun); workerd and
 * browsers hand back a number, which has nothing to unref.
 */
export function unrefTimer(timer: unknown): void {
  (timer as { unref?: () => void }).unref?.();
}
