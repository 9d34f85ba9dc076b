import { load, request } from '../lib/load.js';
import { LOAN, profileArgs, startFloor, startLoanDesk, VARIANTS } from '../lib/loandesk.js';
import { measureSet, round2, target } from '../lib/measure.js';
import { startAll, stopAll } from '../lib/proc.js';

/** Replay ÷ cheapest POST goals of issue 25. */
const GOALS = { 'sqlite-atomic': 0.7, memory: 0.85, redis: 0.7, 'postgres-atomic': 0.7 };

/** Replay does not depend on lease or atomic mode; one variant per store. */
const REPLAY_VARIANTS = VARIANTS.filter((v) =>
  ['sqlite-atomic', 'memory', 'postgres-atomic', 'redis'].includes(v.id),
);

export async function run(ctx) {
  const { servers, failed } = await startAll([
    // The cheapest POST: the same body read by a handler answering a constant 201, no key.
    { id: 'cheapest-post', start: () => startFloor(ctx, 'cheapest') },
    ...REPLAY_VARIANTS.map((variant) => ({
      id: variant.id,
      start: () =>
        startLoanDesk(ctx, variant, { tag: '-replay', execArgv: profileArgs(ctx, `replay-${variant.id}`) }),
    })),
  ]);
  try {
    const cheapest = servers.get('cheapest-post');
    if (!cheapest) throw new Error(`the cheapest POST did not start: ${failed.get('cheapest-post')}`);
    const entries = [
      {
        id: 'cheapest-post',
        run: (durationS) => load({ url: `${cheapest.url}/loans`, body: LOAN, durationS }),
      },
    ];
    for (const variant of REPLAY_VARIANTS) {
      try {
        const server = servers.get(variant.id);
        if (!server) throw new Error(failed.get(variant.id));
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
    const measured = await measureSet(entries, ctx);
    const floor = measured['cheapest-post'];
    const rows = [];
    const targets = [];
    for (const variant of REPLAY_VARIANTS) {
      const read = measured[`${variant.id}:read`];
      const replay = measured[`${variant.id}:replay`];
      if (!read || !replay) {
        rows.push([variant.label, `unavailable: ${failed.get(variant.id)?.slice(0, 160)}`]);
        continue;
      }
      const ratio = replay.rps / floor.rps;
      targets.push(target(`replay: ${variant.label} replay ÷ cheapest POST`, ratio, '>=', GOALS[variant.id]));
      rows.push([
        variant.label,
        Math.round(read.rps),
        Math.round(replay.rps),
        Math.round(floor.rps),
        round2(replay.rps / read.rps),
        round2(ratio),
        `${round2(read.p50Ms)} / ${round2(replay.p50Ms)} / ${round2(floor.p50Ms)}`,
        `${round2(read.p99Ms)} / ${round2(replay.p99Ms)} / ${round2(floor.p99Ms)}`,
        `${read.non2xx + replay.non2xx}/${read.errors + replay.errors}`,
      ]);
    }
    return {
      title: 'Replay of a completed key ÷ GET /loans/:id of the same loan and ÷ the cheapest POST',
      table: {
        columns: [
          'store',
          'GET req/s',
          'replay req/s',
          'cheapest POST req/s',
          'replay ÷ GET',
          'replay ÷ cheapest POST',
          'p50 ms (GET / replay / cheapest)',
          'p99 ms (GET / replay / cheapest)',
          'non-2xx/errors',
        ],
        rows,
      },
      notes: [
        'Replays are counted only when 2xx; a replay answering anything else shows in non-2xx.',
        'Cheapest POST (bench/servers/floor.js, FLOOR=cheapest): a keyless POST of the same body whose handler answers a constant 201, measured in the same interleaved rounds.',
      ],
      targets,
      raw: measured,
    };
  } finally {
    await stopAll(servers);
  }
}
