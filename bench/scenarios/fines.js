import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { load } from '../lib/load.js';
import { startLoanDesk } from '../lib/loandesk.js';
import { informational, measureSet, round2 } from '../lib/measure.js';
import { startAll, startServer, stopAll } from '../lib/proc.js';

const servers = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../servers');
const FINE = { member: 'U-1001', amount: 500 };
const DESK = { id: 'fines', db: 'sqlite', mode: 'atomic' };

/** A payment provider of its own for a contender, on a fresh SQLite file. */
const startProvider = (ctx, name) =>
  startServer(path.join(servers, 'provider.js'), {
    env: { DATABASE_URL: path.join(ctx.tmpDir, `provider_${name}.db`) },
  });

/**
 * POST /fines with a fresh key: the loan desk (retrysafe steps: phases on SQLite, the charge a step)
 * against the same three steps written by hand (servers/fines-floor.js), each charging at a
 * provider of its own (examples/payment-provider, itself retrysafe in atomic mode on SQLite).
 */
export async function run(ctx) {
  const providers = await startAll([
    { id: 'desk', start: () => startProvider(ctx, 'desk') },
    { id: 'floor', start: () => startProvider(ctx, 'floor') },
  ]);
  const { servers: contenders, failed } = await startAll([
    {
      id: 'desk',
      start: () => startLoanDesk(ctx, DESK, { env: { PROVIDER_URL: providers.servers.get('desk').url } }),
    },
    {
      id: 'floor',
      start: () =>
        startServer(path.join(servers, 'fines-floor.js'), {
          env: {
            DATABASE_URL: path.join(ctx.tmpDir, 'fines_floor.db'),
            PROVIDER_URL: providers.servers.get('floor').url,
          },
        }),
    },
  ]);
  for (const [id, message] of [...providers.failed, ...failed]) ctx.log(`  ${id} unavailable: ${message}`);
  try {
    const entries = ['desk', 'floor']
      .filter((id) => contenders.has(id))
      .map((id) => ({
        id,
        run: (durationS) =>
          load({ url: `${contenders.get(id).url}/fines`, body: FINE, keyed: true, durationS }),
      }));
    const measured = await measureSet(entries, ctx);
    const { desk, floor } = measured;
    const ratio = desk && floor ? desk.rps / floor.rps : Number.NaN;
    const row = (label, m) =>
      m
        ? [label, Math.round(m.rps), round2(m.p50Ms), round2(m.p99Ms), `${m.non2xx}/${m.errors}`]
        : [label, 'unavailable'];
    return {
      title: 'Fines: POST /fines (record, charge at the provider, mark paid) with retrysafe steps ÷ by hand',
      table: {
        columns: ['contender', 'req/s', 'p50 ms', 'p99 ms', 'non-2xx/errors'],
        rows: [
          row('loan desk, retrysafe steps (SQLite)', desk),
          row('hand-written, same guarantee (SQLite)', floor),
        ],
      },
      notes: [
        `Body ${JSON.stringify(FINE)}, a fresh key per request, ${ctx.rounds} rounds interleaved. Each contender charges at a payment provider process of its own.`,
        'The desk: a claim, phase `recorded` (the fine and its saved step in one transaction), step `charged` (the provider call, then one write), phase `paid`, the saved response; its lease renewed while it runs.',
        'Hand-written (bench/servers/fines-floor.js): the same three steps in three transactions (claim + fine, charge id, fine paid + response), fenced by an owner token, resumable at the recovery point; no completer, no lease renewal, no events.',
      ],
      targets: [informational('fines: retrysafe steps ÷ hand-written', ratio)],
      raw: measured,
    };
  } finally {
    await stopAll(contenders);
    await stopAll(providers.servers);
  }
}
