import { context, type Span, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  AggregationTemporality,
  type DataPoint,
  type Histogram,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/core/adapter.js';
import type { IdempotencyEvent, IdempotencyEventListener } from '../src/core/contract/index.js';
import { idempotent } from '../src/core/index.js';
import { idempotencyTelemetry } from '../src/otel/index.js';
import { memoryStore } from '../src/stores/memory.js';

/** An SDK set up as a user would, with in-memory exporters to read back what was reported. */
function telemetry() {
  const spans = new InMemorySpanExporter();
  const tracer = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }).getTracer(
    'test',
  );
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  return {
    spans,
    tracer,
    meterProvider,
    /** Data points of one instrument, after a collection. */
    async points<T = number>(name: string): Promise<DataPoint<T>[]> {
      await reader.forceFlush();
      const metrics =
        exporter
          .getMetrics()
          .at(-1)
          ?.scopeMetrics.flatMap((scope) => scope.metrics) ?? [];
      return (metrics.find((metric) => metric.descriptor.name === name)?.dataPoints ?? []) as DataPoint<T>[];
    },
    /** Each finished span's name and attributes, and the outcome counter's points, in order. */
    async spansAndOutcomes() {
      const outcomes = (await this.points('idempotency.outcomes')).map((p) => [
        p.attributes['idempotency.outcome'],
        p.value,
      ]);
      return { spans: spans.getFinishedSpans().map((s) => [s.name, s.attributes]), outcomes };
    },
  };
}

const base = { key: 'order-1', scope: 'tenant-secret-scope' };
const EVENTS: IdempotencyEvent[] = [
  { type: 'executed', ...base, status: 201, handlerMs: 12, storeMs: 2 },
  { type: 'released', ...base, reason: 'not_stored', status: 503, handlerMs: 30, storeMs: 1 },
  { type: 'replayed', ...base, status: 201, storeMs: 1.5 },
  { type: 'replayed', ...base, status: 201, storeMs: 0.5 },
  { type: 'conflict', ...base, storeMs: 1 },
  { type: 'waited', ...base, waitedMs: 40, result: 'replayed' },
  { type: 'fenced', ...base, step: 'complete' },
  { type: 'lease_renewed', ...base },
  { type: 'lease_lost', ...base },
  { type: 'store_error', ...base, operation: 'claim', error: new Error('connection refused') },
  { type: 'rejected', reason: 'key_invalid' },
];

describe('retrysafe/otel', () => {
  const contextManager = new AsyncLocalStorageContextManager();
  beforeAll(() => {
    context.setGlobalContextManager(contextManager.enable());
  });
  afterAll(() => {
    contextManager.disable();
    context.disable();
  });

  let sdk: ReturnType<typeof telemetry>;
  let listener: IdempotencyEventListener;
  beforeEach(() => {
    sdk = telemetry();
    listener = idempotencyTelemetry({ meterProvider: sdk.meterProvider });
  });

  it('counts every event by outcome, with its reason, result, operation or step', async () => {
    for (const event of EVENTS) listener(event);
    const counted = (await sdk.points('idempotency.outcomes')).map((p) => [p.attributes, p.value]);
    expect(counted).toEqual(
      expect.arrayContaining([
        [{ 'idempotency.outcome': 'executed' }, 1],
        [{ 'idempotency.outcome': 'released', 'idempotency.reason': 'not_stored' }, 1],
        [{ 'idempotency.outcome': 'replayed' }, 2],
        [{ 'idempotency.outcome': 'conflict' }, 1],
        [{ 'idempotency.outcome': 'waited', 'idempotency.result': 'replayed' }, 1],
        [{ 'idempotency.outcome': 'fenced', 'idempotency.step': 'complete' }, 1],
        [{ 'idempotency.outcome': 'lease_renewed' }, 1],
        [{ 'idempotency.outcome': 'lease_lost' }, 1],
        [{ 'idempotency.outcome': 'store_error', 'idempotency.operation': 'claim' }, 1],
        [{ 'idempotency.outcome': 'rejected', 'idempotency.reason': 'key_invalid' }, 1],
      ]),
    );
    expect(counted).toHaveLength(10);
  });

  it('records store, handler and wait durations in seconds', async () => {
    for (const event of EVENTS) listener(event);
    const histogram = async (name: string) => {
      const [point, ...more] = await sdk.points<Histogram>(name);
      expect(more).toEqual([]);
      return [point!.value.count, point!.value.sum];
    };
    const [storeCount, storeSum] = await histogram('idempotency.store.duration');
    expect(storeCount).toBe(5);
    expect(storeSum).toBeCloseTo(0.006, 9);
    const [handlerCount, handlerSum] = await histogram('idempotency.handler.duration');
    expect(handlerCount).toBe(2);
    expect(handlerSum).toBeCloseTo(0.042, 9);
    expect(await histogram('idempotency.wait.duration')).toEqual([1, 0.04]);
  });

  it('sets outcome and key on the active span, never the scope; a store error as an exception', () => {
    sdk.tracer.startActiveSpan('POST /loans', (span: Span) => {
      listener(EVENTS[9]!);
      listener(EVENTS[5]!);
      listener(EVENTS[2]!);
      span.end();
    });
    const [span] = sdk.spans.getFinishedSpans();
    expect(span!.attributes).toEqual({ 'idempotency.outcome': 'replayed', 'idempotency.key': 'order-1' });
    expect(span!.events.map((e) => [e.name, e.attributes?.['exception.message']])).toEqual([
      ['exception', 'connection refused'],
    ]);
    expect(JSON.stringify([span!.attributes, span!.events])).not.toContain('tenant-secret-scope');
  });

  it('counts steps by name and marks them as span events, leaving the outcome to the request', async () => {
    sdk.tracer.startActiveSpan('POST /fines', (span: Span) => {
      listener({ type: 'resumed', ...base, finishedSteps: 1 });
      listener({ type: 'step_replayed', ...base, name: 'recorded' });
      listener({ type: 'step_saved', ...base, name: 'charged', phase: false, stepMs: 3 });
      listener(EVENTS[0]!);
      span.end();
    });
    const [span] = sdk.spans.getFinishedSpans();
    expect(span!.attributes).toEqual({ 'idempotency.outcome': 'executed', 'idempotency.key': 'order-1' });
    expect(span!.events.map((e) => [e.name, e.attributes])).toEqual([
      ['idempotency.resumed', { 'idempotency.finished_steps': 1 }],
      ['idempotency.step_replayed', { 'idempotency.step': 'recorded' }],
      ['idempotency.step_saved', { 'idempotency.step': 'charged' }],
    ]);
    const counted = (await sdk.points('idempotency.outcomes')).map((p) => [p.attributes, p.value]);
    expect(counted).toEqual(
      expect.arrayContaining([
        [{ 'idempotency.outcome': 'resumed' }, 1],
        [{ 'idempotency.outcome': 'step_replayed', 'idempotency.step': 'recorded' }, 1],
        [{ 'idempotency.outcome': 'step_saved', 'idempotency.step': 'charged' }, 1],
      ]),
    );
  });

  it('leaves spans alone for lease renewals, which a shared timer reports', () => {
    sdk.tracer.startActiveSpan('another request', (span: Span) => {
      listener(EVENTS[7]!);
      listener(EVENTS[8]!);
      span.end();
    });
    expect(sdk.spans.getFinishedSpans()[0]!.attributes).toEqual({});
  });

  /**
   * Sends the same operation (`send`) twice, each inside a span of its own (`names`): the first
   * span is marked executed, the second replayed, both with `key`, and the counter saw one of each.
   */
  async function expectExecutedThenReplayed(
    names: [string, string],
    key: string,
    send: () => Promise<unknown>,
  ): Promise<void> {
    for (const name of names) {
      await sdk.tracer.startActiveSpan(name, async (span: Span) => {
        await send();
        span.end();
      });
    }
    expect(await sdk.spansAndOutcomes()).toEqual({
      spans: [
        [names[0], { 'idempotency.outcome': 'executed', 'idempotency.key': key }],
        [names[1], { 'idempotency.outcome': 'replayed', 'idempotency.key': key }],
      ],
      outcomes: [
        ['executed', 1],
        ['replayed', 1],
      ],
    });
  }

  it('through the engine: each request marks its own span, and the counter sees both outcomes', async () => {
    const idem = createIdempotency({ store: memoryStore(), onEvent: listener });
    const request = {
      method: 'POST',
      path: '/loans',
      keyHeader: 'order-9',
      contentType: 'application/json',
      authorization: 'Bearer secret-token',
      readBody: async () => Buffer.from('{"isbn":"K-01"}'),
      raw: {},
    };
    const run = async () => ({ status: 201, headers: {}, body: Buffer.from('{}'), complete: true });
    await expectExecutedThenReplayed(['first', 'retry'], 'order-9', () => idem.handle(request, run));
  });

  it("through idempotent(): each delivery marks its consumer's span, the counter sees both outcomes", async () => {
    const run = idempotent({ store: memoryStore(), key: (job: { id: string }) => job.id, onEvent: listener });
    await expectExecutedThenReplayed(['delivery', 'redelivery'], 'job-7', () =>
      run({ id: 'job-7' }, () => ({ sent: true })),
    );
    expect((await sdk.points<Histogram>('idempotency.handler.duration'))[0]?.value.count).toBe(1);
  });

  it('does nothing to spans when none is active', () => {
    expect(trace.getActiveSpan()).toBeUndefined();
    expect(() => listener(EVENTS[0]!)).not.toThrow();
  });
});
