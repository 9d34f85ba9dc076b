import { load } from '../lib/load.js';
import { LOAN, profileArgs, startLoanDesk, VARIANTS } from '../lib/loandesk.js';
import { measureSet, pairRow, target } from '../lib/measure.js';

const GOALS = { 'sqlite-atomic': 0.9, 'postgres-atomic': 0.85, redis: 0.8 };

export async function run(ctx) {
  const servers = new Map();
  const failed = new Map();
  try {
    for (const variant of VARIANTS) {
      try {
        servers.set(
          variant.id,
          await startLoanDesk(ctx, variant, { execArgv: profileArgs(ctx, `overhead-${variant.id}`) }),
        );
      } catch (error) {
        failed.set(variant.id, error.message);
        ctx.log(`  ${variant.id} unavailable: ${error.message}`);
      }
    }
    const entries = [];
    for (const variant of VARIANTS.filter((v) => servers.has(v.id))) {
      const url = `${servers.get(variant.id).url}/loans`;
      entries.push(
        { id: `${variant.id}:no-key`, run: (durationS) => load({ url, body: LOAN, durationS }) },
        { id: `${variant.id}:key`, run: (durationS) => load({ url, body: LOAN, keyed: true, durationS }) },
      );
    }
    const measured = entries.length ? await measureSet(entries, ctx) : {};
    const rows = [];
    const targets = [];
    for (const variant of VARIANTS) {
      const base = measured[`${variant.id}:no-key`];
      const keyed = measured[`${variant.id}:key`];
      const ratio = base && keyed ? keyed.rps / base.rps : Number.NaN;
      if (GOALS[variant.id])
        targets.push(target(`overhead: ${variant.label} keyed ÷ no key`, ratio, '>=', GOALS[variant.id]));
      rows.push(pairRow(variant.label, base, keyed, failed.get(variant.id)));
    }
    return {
      title: 'Overhead: loan desk POST /loans, fresh key ÷ no key',
      table: {
        columns: [
          'store',
          'no key req/s',
          'fresh key req/s',
          'ratio',
          'p50 ms (no key / key)',
          'p99 ms (no key / key)',
          'non-2xx/errors',
        ],
        rows,
      },
      notes: [
        `examples/library-loans/server.js per configuration, body ${JSON.stringify(LOAN)}; both runs hit the same server process, interleaved.`,
      ],
      targets,
      raw: measured,
    };
  } finally {
    for (const server of servers.values()) await server.stop();
  }
}
