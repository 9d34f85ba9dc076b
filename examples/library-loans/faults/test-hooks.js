import { setTimeout as pause } from 'node:timers/promises';

// The desk's test and demo hooks, loaded by app.js only when a setting asks for one
// (`DEMO_FAULTS=1`, `RECEIPT_DELAY_MS`): the files that teach idempotency never see them.

/** `DEMO_FAULTS=1` only: the step after which the desk kills itself (`recorded`, `charged`, `paid`). */
export const CRASH_AFTER_HEADER = 'demo-crash-after';

/**
 * `DEMO_FAULTS=1`: wraps a guarded handler so that a request with `Demo-Crash-After: <step>` kills
 * the process (SIGKILL) right after that step ran and was saved, before it answers: the crash
 * tests' switch. A step replayed from its saved result does not crash again, so a retry goes on.
 */
export const crashAfterStep = (handler) => (req, res, idem) => {
  const point = req.headers[CRASH_AFTER_HEADER];
  if (!point) return handler(req, res, idem);
  const crashing = (run) => async (name, work) => {
    let ran = false;
    const result = await run(name, (tx) => {
      ran = true;
      return work(tx);
    });
    if (ran && name === point) process.kill(process.pid, 'SIGKILL');
    return result;
  };
  return handler(req, res, { ...idem, step: crashing(idem.step), phase: crashing(idem.phase) });
};

/**
 * `RECEIPT_DELAY_MS`, for tests only: `database` whose receipt writes each wait `delayMs` first,
 * so a test's SIGKILL lands between a job's claim and its receipt (receipts.js).
 */
export const slowReceipts = (database, delayMs) => ({
  ...database,
  recordReceipts: async (receipts) => {
    await pause(delayMs);
    return database.recordReceipts(receipts);
  },
  recordReceipt: async (receipt, options) => {
    await pause(delayMs);
    return database.recordReceipt(receipt, options);
  },
});
