import { type Attributes, type MeterProvider, metrics, trace } from '@opentelemetry/api';
import {
  eventDetail,
  type IdempotencyEventListener,
  type IdempotencyEventType,
} from '../core/contract/index.js';

/** Options of {@link idempotencyTelemetry}. */
export interface IdempotencyTelemetryOptions {
  /**
   * Where the instruments are created. Read once, when `idempotencyTelemetry` is called: start
   * the OpenTelemetry SDK first.
   * @default the global meter provider (`metrics.getMeterProvider()`)
   */
  meterProvider?: MeterProvider;
}

/**
 * Bucket bounds in seconds: a store call or a short handler takes well under a millisecond to tens
 * of milliseconds, so the SDK's default bounds (0 to 10,000, made for milliseconds) would put every
 * one in the first bucket.
 */
const DURATION_BUCKETS_S = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** The durations' attributes: none, in one shared set (the SDK would make an empty one per record). */
const NO_ATTRIBUTES: Attributes = Object.freeze({});

interface Tally {
  attributes: Attributes;
  count: number;
}

/**
 * An `onEvent` listener that reports retrysafe to OpenTelemetry.
 *
 * Metrics (from `meterProvider`, meter `retrysafe`):
 * - `idempotency.outcomes` (counter): events by `idempotency.outcome` (`executed`, `replayed`,
 *   `conflict`, `waited`, `released`, `fenced`, `lease_renewed`, `lease_lost`, `store_error`,
 *   `rejected`, `step_saved`, `step_replayed`, `resumed`, `gave_up`, `transaction_ended`,
 *   `circuit`), with `idempotency.reason`, `.result`, `.operation`, `.step` (a fenced call, or a
 *   step's name) or `.state` (`open`, `closed`) where the event has one.
 * - `idempotency.circuit.open` (gauge): 1 while a store's circuit breaker refuses requests, else 0,
 *   by `idempotency.store`.
 * - `idempotency.store.duration` (histogram, s): time a request spent in store calls.
 * - `idempotency.handler.duration` (histogram, s): time a guarded handler took.
 * - `idempotency.wait.duration` (histogram, s): time a duplicate waited for an in-progress original.
 *
 * The histograms carry no attributes and the counter is observed at collection from counts kept
 * here: the SDK hashes the attributes of every synchronous measurement, which cost a guarded
 * request more (about 1 µs each) than the rest of this listener together.
 *
 * Traces: the active span (the HTTP server span of your instrumentation) gets
 * `idempotency.outcome` and `idempotency.key`; a store error is recorded on it as an exception;
 * steps saved or replayed and a completer's takeover are span events (`idempotency.step_saved`, …).
 * The scope never reaches a span or a metric.
 *
 * @example
 * ```ts
 * import { idempotencyTelemetry } from 'retrysafe/otel';
 * const guard = idempotency({ store, onEvent: idempotencyTelemetry() });
 * ```
 */
export function idempotencyTelemetry(options: IdempotencyTelemetryOptions = {}): IdempotencyEventListener {
  const meter = (options.meterProvider ?? metrics.getMeterProvider()).getMeter('retrysafe');
  const outcomes = meter.createObservableCounter('idempotency.outcomes', {
    description: 'Idempotency events by outcome',
    unit: '{event}',
  });
  const histogram = (name: string, description: string) =>
    meter.createHistogram(name, {
      description,
      unit: 's',
      advice: { explicitBucketBoundaries: DURATION_BUCKETS_S },
    });
  const storeDuration = histogram(
    'idempotency.store.duration',
    'Time a request spent in idempotency store calls',
  );
  const handlerDuration = histogram('idempotency.handler.duration', 'Time a guarded handler took');
  const waitDuration = histogram('idempotency.wait.duration', 'Time a duplicate waited for the original');
  // Each store's circuit as its last `circuit` event left it: 1 open, 0 closed.
  const circuits = new Map<string, number>();
  meter
    .createObservableGauge('idempotency.circuit.open', {
      description: 'Whether the store circuit breaker refuses requests (1) or not (0)',
    })
    .addCallback((result) => {
      for (const [store, open] of circuits) result.observe(open, { 'idempotency.store': store });
    });

  // One count per outcome and detail, each with its attribute set made once. An outcome is
  // reported from its first event on (the common ones have their counts from the start).
  const tallies = new Map<string, Tally>();
  outcomes.addCallback((result) => {
    for (const { attributes, count } of tallies.values()) {
      if (count > 0) result.observe(count, attributes);
    }
  });
  const tallyOf = (type: IdempotencyEventType, detail?: { name: string; value: string }): Tally => {
    const id = detail ? `${type}\0${detail.value}` : type;
    let tally = tallies.get(id);
    if (!tally) {
      const attributes = {
        'idempotency.outcome': type,
        ...(detail && { [`idempotency.${detail.name}`]: detail.value }),
      };
      tally = { attributes: Object.freeze(attributes), count: 0 };
      tallies.set(id, tally);
    }
    return tally;
  };
  // The outcomes that have no detail, the common ones, without building an id to look them up.
  const plain: Partial<Record<IdempotencyEventType, Tally>> = {};
  for (const type of ['executed', 'replayed', 'conflict', 'lease_renewed', 'lease_lost'] as const) {
    plain[type] = tallyOf(type);
  }

  return function idempotencyTelemetryListener(event) {
    (plain[event.type] ?? tallyOf(event.type, eventDetail(event))).count++;
    switch (event.type) {
      case 'executed':
      case 'released':
        handlerDuration.record(event.handlerMs / 1000, NO_ATTRIBUTES);
        storeDuration.record(event.storeMs / 1000, NO_ATTRIBUTES);
        break;
      case 'replayed':
      case 'conflict':
        storeDuration.record(event.storeMs / 1000, NO_ATTRIBUTES);
        break;
      case 'waited':
        waitDuration.record(event.waitedMs / 1000, NO_ATTRIBUTES);
        break;
      // Renewals run on a timer shared by every request: the active span there is not theirs.
      case 'lease_renewed':
      case 'lease_lost':
        return;
      // Moments within the request, not its outcome: span events, so the outcome stays the request's.
      case 'step_saved':
      case 'step_replayed':
        trace.getActiveSpan()?.addEvent(`idempotency.${event.type}`, { 'idempotency.step': event.name });
        return;
      case 'circuit':
        circuits.set(event.store, event.state === 'open' ? 1 : 0);
        return;
      case 'resumed':
        trace
          .getActiveSpan()
          ?.addEvent('idempotency.resumed', { 'idempotency.finished_steps': event.finishedSteps });
        return;
    }
    const span = trace.getActiveSpan();
    if (!span) return;
    span.setAttribute('idempotency.outcome', event.type);
    if (event.key !== undefined) span.setAttribute('idempotency.key', event.key);
    if (event.type === 'store_error') {
      span.recordException(event.error instanceof Error ? event.error : String(event.error));
    }
  };
}
