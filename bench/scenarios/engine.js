import { idempotency } from 'retrysafe/node';
import { idempotencyTelemetry } from 'retrysafe/otel';
import { contenders as engineContenders, exchange, SLICE } from '../lib/engine-exchange.js';
import { round2, target } from '../lib/measure.js';
import { median } from '../lib/median.js';

/**
 * µs per keyed request that the engine and the node adapter add over the bare handler, with a
 * store that answers at once (so no database is measured): the handlers (lib/engine-exchange.js)
 * run in this process on real IncomingMessage/ServerResponse objects whose socket discards what
 * is written. Two more guarded handlers measure what listening costs: one with an `onEvent` that
 * counts events by type, one with `retrysafe/otel` on the OpenTelemetry SDK's meter provider.
 */
/**
 * µs of this process's CPU time (user + system, every thread: GC helpers included) per request.
 * Nothing here waits on I/O or timers, so on a quiet machine this is the wall time; on a busy one
 * it leaves out the time other processes held the cores, which wall time would add to whichever
 * contender they happened to interrupt.
 */
async function timePerRequest(serve, count, tag) {
  const started = process.cpuUsage();
  for (let i = 0; i < count; i++) await exchange(serve, `${tag}-${i}`);
  const { user, system } = process.cpuUsage(started);
  return (user + system) / count;
}

/** One round: `count` requests per contender, interleaved in slices; µs per request of each slice. */
async function interleavedRound(contenders, count, round) {
  const names = Object.keys(contenders);
  const slices = Object.fromEntries(names.map((name) => [name, []]));
  for (let slice = 0; slice < count / SLICE; slice++) {
    for (let i = 0; i < names.length; i++) {
      const name = names[(i + slice) % names.length];
      slices[name].push(await timePerRequest(contenders[name], SLICE, `${name}-${round}-${slice}`));
    }
  }
  return slices;
}

const mean = (values) => values.reduce((sum, v) => sum + v, 0) / values.length;

export async function run(ctx) {
  const contenders = engineContenders({ idempotency, idempotencyTelemetry });
  const names = Object.keys(contenders);
  const count = ctx.quick ? 5_000 : 20_000;
  // Slices spread widely (a quarter of them 10 % or more over the median on a shared machine):
  // with 7 rounds (560 slices) a cost % moved by about ±0.8 from run to run, 15 narrow that.
  const rounds = ctx.quick ? 3 : 15;
  for (const name of names) await timePerRequest(contenders[name], count, `warm-${name}`);
  const samples = Object.fromEntries(names.map((name) => [name, []]));
  const slices = Object.fromEntries(names.map((name) => [name, []]));
  for (let round = 0; round < rounds; round++) {
    const perSlice = await interleavedRound(contenders, count, round);
    for (const name of names) {
      samples[name].push(mean(perSlice[name]));
      slices[name].push(...perSlice[name]);
    }
    ctx.log(
      `  round ${round + 1}/${rounds}: ${names.map((n) => `${n} ${round2(samples[n].at(-1))} µs`).join(', ')}`,
    );
  }
  // Every figure is a median over slices, each slice set against the slices run next to it in
  // time: a burst of load from elsewhere moves single slices, not the median.
  const typical = (name) => median(slices[name]);
  const added = median(slices.keyed.map((k, i) => k - slices.bare[i]));
  const costPercent = (variant) =>
    median(slices[variant].map((v, i) => ((v - slices.keyed[i]) / slices.keyed[i]) * 100));
  const eventsPercent = costPercent('events');
  const otelPercent = costPercent('otel');
  return {
    title: 'Engine: µs per keyed request through the engine + node adapter, no-op store',
    table: {
      columns: [
        'bare handler µs',
        'guarded µs',
        'added µs',
        'with onEvent µs',
        'onEvent cost %',
        'with retrysafe/otel µs',
        'otel cost %',
      ],
      rows: [
        [
          round2(typical('bare')),
          round2(typical('keyed')),
          round2(added),
          round2(typical('events')),
          round2(eventsPercent),
          round2(typical('otel')),
          round2(otelPercent),
        ],
      ],
    },
    notes: [
      `${rounds} rounds of ${count} sequential requests per handler, the four handlers taking turns every ${SLICE} requests, in one process on real IncomingMessage/ServerResponse objects; medians over all slices (µs of the process's CPU time per request of a slice, so that time the cores spent on other processes is not counted; added µs and cost % of each slice against its neighbours in time). No network and no database: what is left is the engine and the adapter.`,
      `onEvent: a listener counting events by type. otel: \`idempotencyTelemetry()\` on the OpenTelemetry SDK MeterProvider (no active span). Each slice's per-request figures are kept in the raw results.`,
    ],
    targets: [
      target('engine: µs added per keyed request (no-op store)', added, '<=', 15),
      target('engine: % an onEvent listener adds to a guarded request', eventsPercent, '<=', 5),
      target('engine: % retrysafe/otel adds to a guarded request', otelPercent, '<=', 5),
    ],
    raw: { roundMeans: samples, slices },
  };
}
