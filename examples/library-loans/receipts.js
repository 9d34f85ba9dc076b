import { setTimeout as pause } from 'node:timers/promises';
import { idempotent } from 'retrysafe';
import { databaseUnavailable, sendJson as send } from './http/respond.js';

/** Jobs one claim of the outbox takes; each is a few milliseconds. */
const BATCH = 10;
/** How often a desk looks in the outbox for jobs nobody nudged it about (another desk's, a dead one's). */
const POLL_MS = 250;
const QUEUE = 'receipts';

/**
 * Sends each new loan's receipt exactly once. A loan's receipt job is a row of the database's
 * outbox (`receipt_job`), written in the loan's own transaction (databases/sqlite.js, postgres.js,
 * mysql.js), so no loan is without one and no rolled-back loan has one. Every desk process claims
 * jobs from it for a lease; a job whose process died is claimed again when the lease passes. The
 * receipt itself is written in `idempotent()`'s run keyed by the loan: in atomic mode (keys in the
 * database) the receipt row commits with the saved result, so a delivery after a commit whose
 * process died before marking the job done finds the result and writes nothing. In lease mode the
 * receipt carries the key in a unique column instead, as a lease-mode loan carries its intent.
 *
 * With a Redis (`receipts.redis`, see config.js) the outbox only relays: each job is added to a
 * BullMQ queue under the loan's job id (a relay that died before marking it done adds it again,
 * which BullMQ ignores), and a BullMQ worker in each desk process sends it; a job whose worker
 * died is stalled and delivered again after the lease. `delayMs` (RECEIPT_DELAY_MS, for tests
 * only) pauses before the receipt is written and again before the job is marked done, so a
 * SIGKILL lands mid-job. Answers `nudge()` (a loan was just made here) and `stop()`.
 */
export async function startReceipts({
  database,
  store,
  mode,
  ttlMs,
  leaseMs,
  encryptionKeys,
  receipts,
  logger,
}) {
  const { delayMs, redis } = receipts;
  const send = idempotent({
    store,
    mode,
    ttl: ttlMs,
    lease: leaseMs,
    scope: 'receipts',
    key: (job) => `loan-${job.loanId}`,
    // The delivery number changes between deliveries of one job; the loan does not.
    fingerprint: (job) => ({ loanId: job.loanId }),
    // Saved receipts name the member: encrypted as the loans' answers are.
    encryptionKey: encryptionKeys,
  });

  /** Sends `job`'s receipt (`{ loanId, delivery }`), or returns the one a delivery before sent. */
  async function sendReceipt(job) {
    let wrote = false;
    const receipt = await send(job, async (ctx) => {
      if (delayMs) await pause(delayMs);
      const loan = await database.getLoan(job.loanId);
      const sent = {
        loanId: loan.id,
        member: loan.member,
        isbn: loan.isbn,
        issuedAt: loan.issuedAt,
        sentAt: new Date().toISOString(),
        delivery: job.delivery,
        sentBy: process.pid,
      };
      await database.recordReceipt(sent, { tx: ctx.tx, leaseKey: ctx.tx ? undefined : ctx.key });
      wrote = true;
      return sent;
    });
    // Logged for the operator (and counted by the test): a delivery that found its job done.
    if (!wrote) logger.info({ loanId: job.loanId, delivery: job.delivery }, 'receipt delivery deduplicated');
    if (delayMs) await pause(delayMs);
    return receipt;
  }

  const bull = redis ? await bullQueue(redis, sendReceipt, leaseMs, logger) : undefined;
  // Without a Redis the outbox job is done once the receipt is sent; with one, once it is queued.
  const handle = bull ? (job) => bull.add(job) : sendReceipt;
  const relay = outboxLoop(
    database,
    leaseMs,
    async (job) => {
      await handle(job);
      await database.finishReceiptJob(job.loanId);
    },
    logger,
  );
  return {
    nudge: relay.nudge,
    async stop() {
      await relay.stop();
      await bull?.close();
    },
  };
}

/** Claims the outbox's jobs and hands each to `handle`, now when nudged, else every POLL_MS. */
function outboxLoop(database, leaseMs, handle, logger) {
  let stopped = false;
  let timer;
  let pass = Promise.resolve();
  let again = false;

  async function drain() {
    for (;;) {
      const jobs = await database.claimReceiptJobs(BATCH, leaseMs);
      for (const job of jobs) {
        if (stopped) return;
        // A job that failed stays claimed until its lease passes, then is delivered again.
        await handle(job).catch((error) =>
          logger.warn({ err: error, loanId: job.loanId }, 'receipt job failed'),
        );
      }
      if (jobs.length < BATCH || stopped) return;
    }
  }

  function wake() {
    clearTimeout(timer);
    if (stopped) return;
    again = true;
    pass = pass.then(async () => {
      if (!again || stopped) return;
      again = false;
      await drain().catch((error) => logger.warn({ err: error }, 'receipt outbox pass failed'));
      if (!stopped) timer = setTimeout(wake, POLL_MS).unref();
    });
  }
  wake();
  return {
    nudge: wake,
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await pass;
    },
  };
}

/**
 * The BullMQ queue of receipts on `redis` (`{ url, prefix }`) and this process's worker of it. A
 * worker dead mid-job holds its lock `leaseMs` (renewed while alive); then the job is stalled and
 * delivered again. bullmq loads only here: a desk without a Redis does not need it installed.
 */
async function bullQueue(redis, sendReceipt, leaseMs, logger) {
  const { Queue, Worker } = await import('bullmq');
  const { url, prefix } = redis;
  // Adding fails at once while Redis is down (the outbox job stays and is claimed again after its
  // lease); the worker's blocking reads wait for Redis instead, as BullMQ requires.
  const queue = new Queue(QUEUE, { connection: { url, enableOfflineQueue: false }, prefix });
  const worker = new Worker(
    QUEUE,
    (job) => sendReceipt({ loanId: job.data.loanId, delivery: job.attemptsStarted }),
    {
      connection: { url, maxRetriesPerRequest: null },
      prefix,
      lockDuration: leaseMs,
      stalledInterval: leaseMs,
      maxStalledCount: 1000,
    },
  );
  worker.on('error', (error) => logger.warn({ err: error }, 'receipt worker: Redis'));
  queue.on('error', (error) => logger.warn({ err: error }, 'receipt queue: Redis'));
  return {
    add: ({ loanId }) =>
      queue.add(
        'receipt',
        { loanId },
        // The loan names the job: a second add (a relay died before marking it done) is ignored.
        {
          jobId: `loan-${loanId}`,
          attempts: 1000,
          backoff: { type: 'fixed', delay: 200 },
          removeOnComplete: { age: 86_400 },
        },
      ),
    // A worker stopping with Redis down cannot finish its job's bookkeeping: it is stalled, and delivered again.
    close: () => Promise.all([worker.close(true), queue.close()]),
  };
}

/**
 * `GET /loans/:id/receipt`: 200 with the receipt once sent; 202 `pending` with `Retry-After`
 * while its job waits; 404 for no such loan (or one lent before the desk sent receipts).
 */
export async function answerReceipt(res, database, id) {
  try {
    const found = id === undefined ? undefined : await database.getReceipt(id);
    if (found?.receipt) return send(res, 200, found.receipt);
    if (found) {
      return send(
        res,
        202,
        { status: 'pending', loanId: id, attempts: found.attempts },
        { 'retry-after': '1' },
      );
    }
    const loan = id === undefined ? undefined : await database.getLoan(id);
    send(res, 404, { error: loan ? 'receipt_not_found' : 'loan_not_found' });
  } catch (error) {
    databaseUnavailable(res, 'reading', error);
  }
}
