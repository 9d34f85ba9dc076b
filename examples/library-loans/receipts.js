import { idempotent } from 'retrysafe';
import { databaseUnavailable, sendJson as send } from './http/respond.js';

/** The most jobs one claim takes; one transaction then sends all their receipts. */
const BATCH = 500;
/**
 * How long a nudge lets new loans gather before their receipts go out: under load one claim and
 * one send carry the receipts of every loan lent in the meantime, instead of two per loan.
 */
const GATHER_MS = 50;
/**
 * How often a desk looks for jobs nobody nudged it about (a dead desk's, one lent with
 * RECEIPTS=0). The look is a read: a quiet outbox takes no write lock and writes nothing.
 */
const SWEEP_MS = 2000;
const QUEUE = 'receipts';

/** The receipt of a claimed job (`{ loanId, delivery, member, isbn, issuedAt }`), as sent now. */
const receiptOf = ({ loanId, delivery, member, isbn, issuedAt }) => ({
  loanId,
  member,
  isbn,
  issuedAt,
  sentAt: new Date().toISOString(),
  delivery,
  sentBy: process.pid,
});

/**
 * Sends each new loan's receipt exactly once. A loan's receipt job is a row of the database's
 * outbox (`receipt_job`), written in the loan's own transaction (databases/sqlite.js, postgres.js,
 * mysql.js), so no loan is without one and no rolled-back loan has one. A desk process claims the
 * waiting jobs in batches, for a lease (a job whose process died is claimed again once it passed),
 * then sends the batch in one transaction that writes each receipt only if its job is still unsent
 * and marks it sent: the receipt and the mark commit together or not at all, so a second delivery
 * of a job (its first claimer died, or outlived its lease) writes nothing. No idempotency key is
 * needed there: the outbox and the receipts share one database, and its transaction is the fence.
 *
 * With a Redis (`receipts.redis`, see config.js) the outbox only relays, in batches: the jobs are
 * added to a BullMQ queue under each loan's job id (a relay that died before marking them done
 * adds them again, which BullMQ ignores), and a BullMQ worker in each desk process sends each one.
 * BullMQ delivers a job at least once (a job whose worker died is stalled and delivered again after
 * the lease), from outside the database: there the receipt is written in `idempotent()`'s run
 * keyed by the loan, on the desk's key store. In atomic mode the receipt row commits with the
 * saved result (`ctx.tx`); in lease mode the receipt carries the key in a unique column, as a
 * lease-mode loan carries its intent. A loan deleted before its receipt went out gets none.
 * Answers `nudge()` (a loan was just made here) and `stop()`.
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
  const notWritten = (job, why) => logger.info({ loanId: job.loanId, delivery: job.delivery }, why);
  let relay;
  let bull;
  if (receipts.redis) {
    const sendOnce = idempotent({
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
    const sendReceipt = async (job) => {
      let wrote = false;
      const receipt = await sendOnce(job, async (ctx) => {
        const loan = await database.getLoan(job.loanId);
        if (!loan) return null;
        const sent = receiptOf({ ...loan, loanId: loan.id, delivery: job.delivery });
        await database.recordReceipt(sent, { tx: ctx.tx, leaseKey: ctx.tx ? undefined : ctx.key });
        wrote = true;
        return sent;
      });
      // Logged for the operator (and counted by the test): a delivery that found its job done.
      if (!wrote)
        notWritten(job, receipt ? 'receipt delivery deduplicated' : 'receipt not sent: loan deleted');
      return receipt;
    };
    bull = await bullQueue(receipts.redis, sendReceipt, leaseMs, logger);
    // The outbox's job is done once BullMQ holds it.
    relay = async (jobs) => {
      await bull.addBulk(jobs);
      await database.finishReceiptJobs(jobs.map((job) => job.loanId));
    };
  } else {
    relay = async (jobs) => {
      const written = await database.recordReceipts(jobs.map(receiptOf));
      // Logged for the operator (and counted by the test): another delivery sent these.
      for (const job of jobs) if (!written.has(job.loanId)) notWritten(job, 'receipt delivery deduplicated');
    };
  }
  const outbox = outboxLoop(database, leaseMs, relay, logger);
  return {
    nudge: outbox.nudge,
    async stop() {
      await outbox.stop();
      await bull?.close();
    },
  };
}

/**
 * Claims the outbox's jobs in batches and hands each batch to `relay`: GATHER_MS after a nudge,
 * else every SWEEP_MS once a read finds a job waiting. A batch that failed stays claimed until its
 * lease passes, then is claimed again.
 */
function outboxLoop(database, leaseMs, relay, logger) {
  let stopped = false;
  let timer;
  let dueAt = Number.POSITIVE_INFINITY;
  let pass = Promise.resolve();

  async function drain(sweep) {
    if (sweep && !(await database.receiptJobsWaiting())) return;
    for (;;) {
      const jobs = await database.claimReceiptJobs(BATCH, leaseMs);
      if (jobs.length > 0) await relay(jobs);
      if (jobs.length < BATCH || stopped) return;
    }
  }

  /** Starts a pass in `delayMs`, unless one is due sooner. */
  function passIn(delayMs, sweep) {
    if (stopped || Date.now() + delayMs >= dueAt) return;
    clearTimeout(timer);
    dueAt = Date.now() + delayMs;
    timer = setTimeout(() => {
      dueAt = Number.POSITIVE_INFINITY;
      pass = pass.then(async () => {
        await drain(sweep).catch((error) => logger.warn({ err: error }, 'receipt outbox pass failed'));
        passIn(SWEEP_MS, true);
      });
    }, delayMs).unref();
  }
  // At start, jobs left by a desk before this one (or one with RECEIPTS=0) go out at once.
  passIn(0, true);
  return {
    nudge: () => passIn(GATHER_MS, false),
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
    addBulk: (jobs) =>
      queue.addBulk(
        jobs.map(({ loanId }) => ({
          name: 'receipt',
          data: { loanId },
          // The loan names the job: a second add (a relay died before marking it done) is ignored.
          opts: {
            jobId: `loan-${loanId}`,
            attempts: 1000,
            backoff: { type: 'fixed', delay: 200 },
            removeOnComplete: { age: 86_400 },
          },
        })),
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
