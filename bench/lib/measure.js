import { median } from './median.js';

/**
 * Runs every entry `rounds` times for `durationS` each, after one warm-up run per entry, rotating
 * the order each round so no contender always runs first (or last) on a shared machine. Returns
 * the medians per entry id.
 */
export async function measureSet(entries, { rounds, durationS, warmupS, log }) {
  for (const entry of entries) await entry.run(warmupS);
  const samples = new Map(entries.map((entry) => [entry.id, []]));
  for (let round = 0; round < rounds; round++) {
    const order = entries.map((_, i) => entries[(i + round) % entries.length]);
    for (const entry of order) {
      const sample = await entry.run(durationS);
      samples.get(entry.id).push(sample);
      log?.(
        `  round ${round + 1}/${rounds} ${entry.id}: ${Math.round(sample.rps)} req/s p50 ${sample.p50Ms} ms p99 ${sample.p99Ms} ms${sample.non2xx || sample.errors ? ` (${sample.non2xx} non-2xx, ${sample.errors} errors)` : ''}`,
      );
    }
  }
  const result = {};
  for (const [id, list] of samples) {
    result[id] = {
      rps: median(list.map((s) => s.rps)),
      p50Ms: median(list.map((s) => s.p50Ms)),
      p99Ms: median(list.map((s) => s.p99Ms)),
      non2xx: list.reduce((n, s) => n + s.non2xx, 0),
      errors: list.reduce((n, s) => n + s.errors, 0),
      rounds: list.map((s) => Math.round(s.rps)),
    };
  }
  return result;
}

/** A target line for the report: `value op target`, with whether it is met. */
export function target(name, value, op, goal) {
  const compare = { '>=': (v) => v >= goal, '<=': (v) => v <= goal, '==': (v) => v === goal }[op];
  const met = Number.isFinite(value) ? compare(value) : false;
  return { name, value: Number.isFinite(value) ? Number(value.toFixed(3)) : null, op, target: goal, met };
}

/** A figure listed with the targets for context, with no goal of its own. */
export function informational(name, value) {
  return {
    name,
    value: Number.isFinite(value) ? Number(value.toFixed(3)) : null,
    op: null,
    target: null,
    met: null,
  };
}

export const round2 = (value) => (Number.isFinite(value) ? Number(value.toFixed(2)) : null);

/**
 * A table row comparing a contender with its baseline (req/s, ratio, p50 and p99 pairs, failures),
 * or the reason the variant could not be measured.
 */
export function pairRow(label, base, other, unavailable) {
  if (!base) return [label, `unavailable: ${unavailable?.slice(0, 160)}`, null, null, null, null, null];
  return [
    label,
    Math.round(base.rps),
    Math.round(other.rps),
    round2(other.rps / base.rps),
    `${round2(base.p50Ms)} / ${round2(other.p50Ms)}`,
    `${round2(base.p99Ms)} / ${round2(other.p99Ms)}`,
    `${base.non2xx + other.non2xx}/${base.errors + other.errors}`,
  ];
}
