import { load, request } from '../lib/load.js';
import { LOAN, profileArgs, startLoanDesk, VARIANTS } from '../lib/loandesk.js';
import { measureSet, pairRow, target } from '../lib/measure.js';

/** Replay does not depend on lease or atomic mode; one variant per store. */
const REPLAY_VARIANTS = VARIANTS.filter((v) =>
  ['sqlite-atomic', 'memory', 'postgres-atomic', 'redis'].includes(v.id),
);

export async function run(ctx) {
  const servers = new Map();
  const failed = new Map();
  try {
    const entries = [];
    for (const variant of REPLAY_VARIANTS) {
      try {
        const server = await startLoanDesk(ctx, variant, {
          tag: '-replay',
          execArgv: profileArgs(ctx, `replay-${variant.id}`),
        });
        servers.set(variant.id, server);
        const key = `${ctx.runId}-replay-${variant.id}`;
        const created = await request(`${server.url}/loans`, {
          body: LOAN,
          headers: { 'idempotency-key': key },
        });
        if (created.status !== 201) throw new Error(`POST /loans answered ${created.status} ${created.text}`);
        const { id } = JSON.parse(created.text);
        const loansUrl = `${server.url}/loans`;
        entries.push(
          {
            id: `${variant.id}:read`,
            run: (durationS) =>
              load({ url: `${loansUrl}/${encodeURIComponent(id)}`, method: 'GET', durationS }),
          },
          {
            id: `${variant.id}:replay`,
            run: (durationS) => load({ url: loansUrl, body: LOAN, fixedKey: key, durationS }),
          },
        );
      } catch (error) {
        failed.set(variant.id, error.message);
        ctx.log(`  ${variant.id} unavailable: ${error.message}`);
      }
    }
    const measured = entries.length ? await measureSet(entries, ctx) : {};
    const rows = [];
    const targets = [];
    for (const variant of REPLAY_VARIANTS) {
      const read = measured[`${variant.id}:read`];
      const replay = measured[`${variant.id}:replay`];
      const ratio = read && replay ? replay.rps / read.rps : Number.NaN;
      targets.push(target(`replay: ${variant.label} replay ÷ GET /loans/:id`, ratio, '>=', 1));
      rows.push(pairRow(variant.label, read, replay, failed.get(variant.id)));
    }
    return {
      title: 'Replay of a completed key ÷ GET /loans/:id of the same loan',
      table: {
        columns: [
          'store',
          'GET req/s',
          'replay req/s',
          'ratio',
          'p50 ms (GET / replay)',
          'p99 ms (GET / replay)',
          'non-2xx/errors',
        ],
        rows,
      },
      notes: ['Replays are counted only when 2xx; a replay answering anything else shows in non-2xx.'],
      targets,
      raw: measured,
    };
  } finally {
    for (const server of servers.values()) await server.stop();
  }
}
