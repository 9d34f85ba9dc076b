// The loan desk: `npm start` (settings in config.js; DATABASE_URL, PORT, WORKERS, IDEMPOTENCY_*).
import cluster from 'node:cluster';
import { describeAdminAccess } from './admin.js';
import { deskUrl, startLoanDesk } from './app.js';
import { describe, readConfig } from './config.js';
import { openDatabase } from './databases/index.js';
import { behindFaultFront, startFaultFront } from './faults/fault-front.js';
import { aggregateWorkerMetrics } from './operations.js';

/**
 * How long a stopping process lets requests in flight finish before it cuts them and exits 1: a
 * loan takes milliseconds, and an orchestrator's own grace (Kubernetes: 30 s) must outlast ours.
 */
const SHUTDOWN_GRACE_MS = 5000;

async function serve(config, { setup }) {
  const desk = await startLoanDesk(config.demoFaults ? behindFaultFront(config) : config, { setup });
  // With WORKERS=N the primary runs the front, once every worker listens.
  const front = config.demoFaults && cluster.isPrimary ? await startFaultFront(config, desk.port) : undefined;
  if (cluster.isWorker) {
    console.log(`worker ${process.pid} serving ${desk.url}`);
  } else {
    const url = front ? deskUrl(config.host, front.port) : desk.url;
    console.log(`loan desk listening on ${url} (${describe(config)})`);
    console.log(describeAdminAccess(config, url));
  }
  // Unlike the database, which the setup needs, Redis holds nothing to set up: the desk serves
  // while it is down (keyed loans 503, the rest as usual) and recovers by itself, as after an
  // outage at run time. A Redis that does not answer at start is said, so a typo is not silent.
  if (config.keys.kind === 'redis') {
    desk.store
      .get('anonymous', 'start-check')
      .catch((error) =>
        console.warn(
          `loan desk: IDEMPOTENCY_STORE (Redis at ${new URL(config.keys.url).host}) does not answer: ${error.message}; keyed loans answer 503 until it does`,
        ),
      );
  }
  const who = cluster.isWorker ? `loan desk worker ${process.pid}` : 'loan desk';
  const stop = (signal) => {
    const closed = desk.close().then(() => front?.close());
    console.log(
      `${who}: ${signal}: stopped accepting connections; finishing the requests in flight (at most ${SHUTDOWN_GRACE_MS / 1000} s)`,
    );
    setTimeout(() => {
      console.error(`${who}: requests still in flight after ${SHUTDOWN_GRACE_MS / 1000} s were cut`);
      process.exit(1);
    }, SHUTDOWN_GRACE_MS).unref();
    closed.then(() => {
      console.log(`${who}: stopped`);
      process.exit(0);
    });
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

/**
 * The primary of `WORKERS=N`: creates the schema and catalog once, then forks N workers that share
 * the port and the database, and adds up their metrics for `GET /metrics`. A worker that dies after
 * the desk is up is replaced; one that dies during start stops the desk, as it would die again.
 *
 * The workers accept connections themselves (`SCHED_NONE`) rather than have the primary deal them
 * out in turn (node:cluster's default on Linux): a connection the primary dealt to a worker killed
 * before it took it stays open, unanswered, for good (node 20). Accepted by the worker, it dies with
 * it: its client sees the connection reset and retries, which its `Idempotency-Key` makes safe.
 */
async function supervise(config) {
  cluster.schedulingPolicy = cluster.SCHED_NONE;
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
  const announce = (port) => {
    const url = deskUrl(config.host, port);
    console.log(`loan desk listening on ${url} (${config.workers} workers; ${describe(config)})`);
    console.log(describeAdminAccess(config, url));
  };
  cluster.on('listening', (_worker, address) => {
    if (ready || ++listening < config.workers) return;
    ready = true;
    if (!config.demoFaults) return announce(address.port);
    // The workers listen on one port: behind the front, the same free one (node:cluster's listen(0)).
    startFaultFront(config, address.port).then(
      (front) => announce(front.port),
      (error) => {
        console.error(`loan desk: the fault proxy cannot listen: ${error.message}`);
        process.exit(1);
      },
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
  const stop = (signal) => {
    stopping = true;
    console.log(`loan desk: ${signal}: stopping ${Object.keys(cluster.workers).length} workers`);
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
