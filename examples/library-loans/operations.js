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
  // Every keyed request is an event or two: they are counted here and handed to prom-client when
  // the metrics are collected, since its inc() checks and hashes the labels on every call (with
  // the observe() below, 31k of the 205k main-thread instructions a replay cost; 8k now).
  const outcomeCounts = new Map();
  new client.Counter({
    name: 'retrysafe_outcomes_total',
    help: 'Idempotency events by outcome, and why (released, rejected), how (waited) or where (store_error)',
    labelNames: ['outcome', 'reason'],
    registers,
    collect() {
      for (const counted of outcomeCounts.values()) {
        if (counted.count > 0) this.inc(counted.labels, counted.count);
        counted.count = 0;
      }
    },
  });
  const countOutcome = (outcome, reason) => {
    const id = `${outcome}\0${reason}`;
    const counted = outcomeCounts.get(id);
    if (counted) counted.count++;
    else outcomeCounts.set(id, { labels: { outcome, reason }, count: 1 });
  };
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

  // A histogram's child is looked up by a string, since prom-client sorts and hashes a label
  // object on every observe() given one.
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
    countOutcome(event.type, eventDetail(event)?.value ?? '');
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
      case 'circuit':
        if (event.state === 'open') {
          logger.error(
            { event: event.type, store: event.store, failures: event.failures },
            'the key store failed its last calls: keyed requests are refused with 503 until it answers again (GET /health)',
          );
        } else logger.info({ event: event.type, store: event.store }, 'the key store answers again');
        return;
      case 'rejected':
        if (event.reason !== 'replay_unreadable') break;
        logger.error(
          { event: event.type, reason: event.reason, key: event.key },
          'a saved answer or step of this key cannot be decrypted: the encryption key that sealed it is no longer configured',
        );
        return;
      case 'gave_up':
        logger.error(
          { event: event.type, key: event.key, resumes: event.resumes },
          `the completer gave up on an operation after ${event.resumes} attempts: its retries are answered 500 operation_abandoned; its finished steps (a charge) stay and need settling by hand`,
        );
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
 * A worker's registries: the desk's series, which the primary sums over the workers, and the
 * process metrics, which carry the worker's id: a sum or an average of N heaps, CPU times or
 * event-loop lags describes no process. prom-client's `AggregatorRegistry` answers the primary's
 * requests for both; `collect` asks the primary for the whole desk, whichever worker the scrape
 * lands on.
 */
function workerRegistries() {
  const registry = new client.Registry();
  const processRegistry = new client.Registry();
  processRegistry.setDefaultLabels({ worker: String(cluster.worker.id) });
  client.AggregatorRegistry.setRegistries([registry, processRegistry]);
  new client.AggregatorRegistry();

  const waiting = new Map();
  let lastId = 0;
  process.on('message', (message) => {
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
      process.send({ type: METRICS_REQUEST, id });
    });
  return { registry, processRegistry, collect };
}

/**
 * The primary of `WORKERS=N`: answers a worker's request for the desk's metrics with prom-client's
 * `clusterMetrics()`, the series of every connected worker added up (counters and histograms
 * summed, process metrics one series per worker). A worker that does not answer within 5 s (one
 * stuck, or one that died or was just forked while the primary asked) fails the scrape, which the
 * next scrape makes up for.
 */
export function aggregateWorkerMetrics() {
  const aggregator = new client.AggregatorRegistry();
  // clusterMetrics() writes to every connected worker without a callback: to one dead but not yet
  // seen dead the write fails with an 'error', which unheard would end the primary.
  cluster.on('fork', (worker) => worker.on('error', () => {}));
  cluster.on('message', (worker, message) => {
    if (message?.type !== METRICS_REQUEST) return;
    aggregator.clusterMetrics().then(
      (text) => worker.send({ type: METRICS_ANSWER, id: message.id, text }),
      (error) => worker.send({ type: METRICS_ANSWER, id: message.id, error: error.message }),
    );
  });
}
