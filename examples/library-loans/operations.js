import cluster from 'node:cluster';
import pino from 'pino';
import client from 'prom-client';
import { eventDetail } from 'retrysafe';
import { hasAdminToken, sendUnauthorized } from './admin.js';

/**
 * Store-error lines written per interval; past that they are counted, and one line per interval
 * says how many were left out. During an outage every keyed request fails the same way: ten lines
 * a minute show the cause without filling the disk at the request rate.
 */
const STORE_ERROR_LINES_PER_INTERVAL = 10;
const STORE_ERROR_INTERVAL_MS = 60_000;

/** Seconds: a store call or a loan takes from well under a millisecond to a few hundred. */
const DURATION_BUCKETS_S = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** IPC: a worker asks the primary for the whole desk's metrics; the primary answers. */
const METRICS_REQUEST = 'loan-desk:metrics-request';
const METRICS_ANSWER = 'loan-desk:metrics-answer';
/** IPC: the primary asks every worker for its series; each answers with them. */
const SERIES_REQUEST = 'loan-desk:series-request';
const SERIES_ANSWER = 'loan-desk:series-answer';

/**
 * How long the primary waits for a live worker's series before the scrape fails: a worker answers
 * in milliseconds unless its event loop is stuck, and a stuck worker's totals are better missing
 * from a failed scrape than silently left out of a successful one. A worker that dies meanwhile is
 * not waited for.
 */
const WORKER_SERIES_TIMEOUT_MS = 5000;

/**
 * Writes at most `lines` lines per `intervalMs`; the rest are counted, and their count is written
 * when the interval ends (or at `flush`).
 */
function rateLimited(write, summarize, { lines, intervalMs }) {
  let windowEndsMs = 0;
  let written = 0;
  let suppressed = 0;
  let timer;
  const report = () => {
    clearTimeout(timer);
    timer = undefined;
    if (suppressed > 0) summarize(suppressed, intervalMs);
    suppressed = 0;
  };
  return {
    log(...args) {
      const now = Date.now();
      if (now >= windowEndsMs) {
        report();
        windowEndsMs = now + intervalMs;
        written = 0;
      }
      if (written < lines) {
        written++;
        write(...args);
        return;
      }
      suppressed++;
      if (!timer) {
        timer = setTimeout(report, windowEndsMs - now);
        timer.unref();
      }
    },
    flush: report,
  };
}

/**
 * The desk's operations side: JSON logs (pino, at `logLevel`), Prometheus metrics (prom-client) fed
 * by retrysafe's `onEvent`, and the `GET /metrics` route. Series:
 * - `retrysafe_outcomes_total{outcome, reason}`: every idempotency event (executed, replayed,
 *   conflict, waited, released, fenced, lease_renewed, lease_lost, store_error, rejected), `reason`
 *   saying why it was released or rejected, how a wait ended, which store call failed;
 * - `retrysafe_store_duration_seconds{outcome}`: time a request spent in key-store calls;
 * - `retrysafe_handler_duration_seconds{outcome}`: time a guarded loan took;
 * - `retrysafe_wait_duration_seconds`: time a duplicate waited for its original;
 * - `retrysafe_keys_purged_total`: expired keys deleted by the purge;
 * - the process metrics of `collectDefaultMetrics` (CPU, memory, event loop lag, …).
 * In a worker of `WORKERS=N`, `/metrics` answers the whole desk (see `aggregateWorkerMetrics`).
 */
export function operations({ logLevel = 'info', destination, adminToken } = {}) {
  const logger = pino({ level: logLevel }, destination);
  const { registry, processRegistry, collect } = cluster.isWorker ? workerRegistries() : localRegistries();
  client.collectDefaultMetrics({ register: processRegistry });
  const registers = [registry];
  const outcomes = new client.Counter({
    name: 'retrysafe_outcomes_total',
    help: 'Idempotency events by outcome, and why (released, rejected), how (waited) or where (store_error)',
    labelNames: ['outcome', 'reason'],
    registers,
  });
  const histogram = (name, help, labelNames) =>
    new client.Histogram({ name, help, labelNames, buckets: DURATION_BUCKETS_S, registers });
  const storeSeconds = histogram(
    'retrysafe_store_duration_seconds',
    'Time one request spent in idempotency key-store calls',
    ['outcome'],
  );
  const handlerSeconds = histogram('retrysafe_handler_duration_seconds', 'Time a guarded handler took', [
    'outcome',
  ]);
  const waitSeconds = histogram(
    'retrysafe_wait_duration_seconds',
    'Time a duplicate waited for the original',
    [],
  );
  const purged = new client.Counter({
    name: 'retrysafe_keys_purged_total',
    help: 'Expired idempotency keys deleted by the purge',
    registers,
  });

  const storeErrors = rateLimited(
    (event) =>
      logger.error(
        { event: event.type, operation: event.operation, key: event.key, err: event.error },
        `idempotency store ${event.operation} failed: ${event.error?.message ?? String(event.error)}`,
      ),
    (count, intervalMs) =>
      logger.error(
        { event: 'store_error', suppressed: count },
        `${count} more idempotency store errors in the last ${intervalMs / 1000} s were not logged`,
      ),
    { lines: STORE_ERROR_LINES_PER_INTERVAL, intervalMs: STORE_ERROR_INTERVAL_MS },
  );

  // Every event touches a series or two: each series' child is looked up by a string, since
  // prom-client sorts and hashes a label object on every inc() or observe() given one.
  const series = new Map();
  const seriesOf = (metric, ...values) => {
    const id = `${metric.name}\0${values.join('\0')}`;
    let child = series.get(id);
    if (!child) {
      child = metric.labels(...values);
      series.set(id, child);
    }
    return child;
  };

  function onEvent(event) {
    seriesOf(outcomes, event.type, eventDetail(event)?.value ?? '').inc();
    switch (event.type) {
      case 'executed':
      case 'released':
        seriesOf(handlerSeconds, event.type).observe(event.handlerMs / 1000);
        seriesOf(storeSeconds, event.type).observe(event.storeMs / 1000);
        break;
      case 'replayed':
      case 'conflict':
        seriesOf(storeSeconds, event.type).observe(event.storeMs / 1000);
        break;
      case 'waited':
        waitSeconds.observe(event.waitedMs / 1000);
        break;
      case 'store_error':
        storeErrors.log(event);
        return;
      case 'fenced':
      case 'lease_lost':
        logger.warn(
          { event: event.type, key: event.key },
          'a lease was lost while its handler ran: the loan may have been made twice',
        );
        return;
    }
    if (logger.isLevelEnabled('debug')) logger.debug({ ...event }, event.type);
  }

  async function sendMetrics(req, res) {
    try {
      const text = await collect();
      res.writeHead(200, { 'content-type': registry.contentType });
      res.end(req.method === 'HEAD' ? undefined : text);
    } catch (error) {
      logger.error({ err: error }, 'collecting metrics failed');
      res.writeHead(500).end();
    }
  }

  return {
    logger,
    onEvent,
    /** Counts the keys a purge deleted. */
    purged: (count) => purged.inc(count),
    /** Serves `GET /metrics` (to the bearer of `adminToken` when set); answers `false` for other paths. */
    route(req, res, pathname) {
      if (pathname !== '/metrics' || (req.method !== 'GET' && req.method !== 'HEAD')) return false;
      if (adminToken && !hasAdminToken(req, adminToken)) {
        sendUnauthorized(res, 'Send the desk’s ADMIN_TOKEN as "Authorization: Bearer <token>".');
      } else sendMetrics(req, res);
      return true;
    },
    /** Writes the count of store errors left out so far. */
    close: () => storeErrors.flush(),
  };
}

function localRegistries() {
  const registry = new client.Registry();
  return { registry, processRegistry: registry, collect: () => registry.metrics() };
}

/**
 * A worker's registries: the desk's series, summed over the workers by the primary, and the
 * process metrics, which carry the worker's id: a sum or an average of N heaps, CPU times or
 * event-loop lags describes no process. The worker answers the primary's requests for both
 * (`aggregateWorkerMetrics`); `collect` asks the primary for the whole desk, whichever worker the
 * scrape lands on.
 */
function workerRegistries() {
  const registry = new client.Registry();
  const processRegistry = new client.Registry();
  processRegistry.setDefaultLabels({ worker: String(cluster.worker.id) });

  const waiting = new Map();
  let lastId = 0;
  process.on('message', (message) => {
    if (message?.type === SERIES_REQUEST) {
      Promise.all([registry, processRegistry].map((r) => r.getMetricsAsJSON()))
        .then(
          (series) => ({ series }),
          (error) => ({ error: error.message }),
        )
        // The callback takes the error of a primary gone meanwhile: there is no one left to answer.
        .then((answer) => process.send({ type: SERIES_ANSWER, id: message.id, ...answer }, () => {}));
      return;
    }
    if (message?.type !== METRICS_ANSWER) return;
    waiting.get(message.id)?.(message);
    waiting.delete(message.id);
  });
  const collect = () =>
    new Promise((resolve, reject) => {
      const id = ++lastId;
      waiting.set(id, (answer) =>
        answer.error === undefined ? resolve(answer.text) : reject(new Error(answer.error)),
      );
      process.send({ type: METRICS_REQUEST, id }, (error) => {
        if (!error) return;
        waiting.delete(id);
        reject(error);
      });
    });
  return { registry, processRegistry, collect };
}

/**
 * The primary of `WORKERS=N`: answers a worker's request for the desk's metrics with prom-client's
 * aggregate of the series of every worker in `listening` (`listeningWorkers`): counters and
 * histograms summed, process metrics one series per worker. A worker that dies before it answers is left out, at once: its counts leave
 * the totals as they would after its death anyway. One alive that has not answered within
 * `WORKER_SERIES_TIMEOUT_MS` fails the scrape.
 */
export function aggregateWorkerMetrics(listening) {
  const collections = new Map();
  let lastId = 0;

  function collectDesk() {
    return new Promise((resolve, reject) => {
      const id = ++lastId;
      const waiting = new Set();
      const series = [];
      const settle = (error) => {
        clearTimeout(timer);
        collections.delete(id);
        if (error) reject(error);
        else resolve(client.AggregatorRegistry.aggregate(series).metrics());
      };
      const leaveOut = (worker) => {
        if (waiting.delete(worker.id) && waiting.size === 0) settle();
      };
      const timer = setTimeout(
        () =>
          settle(
            new Error(
              `worker ${[...waiting].join(', ')} did not answer within ${WORKER_SERIES_TIMEOUT_MS} ms`,
            ),
          ),
        WORKER_SERIES_TIMEOUT_MS,
      );
      collections.set(id, {
        leaveOut,
        answered(worker, answer) {
          if (!waiting.has(worker.id)) return;
          if (answer.error !== undefined) return settle(new Error(answer.error));
          series.push(...answer.series);
          leaveOut(worker);
        },
      });
      for (const worker of Object.values(cluster.workers)) {
        if (!listening.has(worker) || !worker.isConnected()) continue;
        waiting.add(worker.id);
        // A worker dead but not yet seen dead fails the write here, or never answers: its exit
        // leaves it out. Without this callback the failed write is an 'error' that ends the primary.
        worker.send({ type: SERIES_REQUEST, id }, (error) => error && leaveOut(worker));
      }
      if (waiting.size === 0) settle();
    });
  }

  cluster.on('message', (worker, message) => {
    if (message?.type === SERIES_ANSWER) {
      collections.get(message.id)?.answered(worker, message);
      return;
    }
    if (message?.type !== METRICS_REQUEST) return;
    collectDesk()
      .then(
        (text) => ({ text }),
        (error) => ({ error: error.message }),
      )
      // The callback takes the error of a worker gone meanwhile: there is no one left to answer.
      .then((answer) => worker.send({ type: METRICS_ANSWER, id: message.id, ...answer }, () => {}));
  });
  const leaveOutEverywhere = (worker) => {
    for (const collection of collections.values()) collection.leaveOut(worker);
  };
  cluster.on('disconnect', leaveOutEverywhere);
  cluster.on('exit', leaveOutEverywhere);
}
