// The loan desk: `npm start` (settings in config.js; DATABASE_URL, PORT, WORKERS, IDEMPOTENCY_*).
import cluster from 'node:cluster';
import { deskUrl, startLoanDesk } from './app.js';
import { describe, readConfig } from './config.js';
import { openDatabase } from './database.js';
import { aggregateWorkerMetrics } from './operations.js';

/** How long a stopping process lets requests in flight finish before it exits anyway. */
const SHUTDOWN_GRACE_MS = 10_000;

async function serve(config, { setup }) {
  const desk = await startLoanDesk(config, { setup });
  if (cluster.isWorker) console.log(`worker ${process.pid} serving ${desk.url}`);
  else console.log(`loan desk listening on ${desk.url} (${describe(config)})`);
  const stop = () => {
    setTimeout(() => process.exit(1), SHUTDOWN_GRACE_MS).unref();
    desk.close().then(() => process.exit(0));
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

/**
 * The primary of `WORKERS=N`: creates the schema and catalog once, then forks N workers that share
 * the port and the database, and adds up their metrics for `GET /metrics`. A worker that dies after
 * the desk is up is replaced; one that dies during start stops the desk, as it would die again.
 *
 * The workers accept connections themselves from the one listening socket (`SCHED_NONE`), so a
 * connection waits in the kernel's queue until a live worker takes it. With node:cluster's default
 * on Linux (`SCHED_RR`) the primary accepts and hands each connection to a worker; one handed to a
 * worker killed before the primary saw it die stays open in the primary, unanswered, for good
 * (`test/e2e.loan-desk-worker-death.test.ts`). NODE_CLUSTER_SCHED_POLICY=rr brings the round robin
 * back, for whoever prefers its even spread of connections to that risk.
 */
async function supervise(config) {
  if (!process.env.NODE_CLUSTER_SCHED_POLICY) cluster.schedulingPolicy = cluster.SCHED_NONE;
  const database = await openDatabase(config, { setup: true });
  await database.close();
  if (config.keys.kind === 'memory') {
    console.warn(
      'loan desk: IDEMPOTENCY_STORE=memory keeps keys per worker; retries landing on another worker run again',
    );
  }
  aggregateWorkerMetrics();
  let ready = false;
  let stopping = false;
  let listening = 0;
  cluster.on('listening', (_worker, address) => {
    if (ready || ++listening < config.workers) return;
    ready = true;
    console.log(
      `loan desk listening on ${deskUrl(config.host, address.port)} (${config.workers} workers; ${describe(config)})`,
    );
  });
  cluster.on('exit', (worker, code, signal) => {
    if (stopping) {
      if (Object.keys(cluster.workers).length === 0) process.exit(0);
      return;
    }
    if (!ready) {
      console.error(`loan desk: worker ${worker.process.pid} failed to start (${signal ?? `exit ${code}`})`);
      process.exit(1);
    }
    console.error(
      `loan desk: worker ${worker.process.pid} died (${signal ?? `exit ${code}`}); starting another`,
    );
    cluster.fork();
  });
  const stop = () => {
    stopping = true;
    for (const worker of Object.values(cluster.workers)) worker.process.kill('SIGTERM');
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  for (let i = 0; i < config.workers; i++) cluster.fork();
}

try {
  const config = readConfig();
  if (cluster.isPrimary && config.workers > 1) await supervise(config);
  else await serve(config, { setup: cluster.isPrimary });
} catch (error) {
  console.error(`loan desk: ${error.message}`);
  process.exit(1);
}
