import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { loadDuring } from '../lib/load.js';
import { round2, target } from '../lib/measure.js';
import { startAll, startServer } from '../lib/proc.js';
import { PG_URL, pgSchemaUrl } from '../lib/services.js';

const WORKER = path.join(path.dirname(fileURLToPath(import.meta.url)), '../servers/store-worker.js');

const fmt = (n) => (n >= 1e6 ? `${n / 1e6}M` : n >= 1e3 ? `${n / 1e3}k` : String(n));

/** The store worker of `kind` (sqlite or postgres) on its own fresh file or schema. */
async function startWorker(ctx, kind) {
  const env = { KIND: kind };
  if (kind === 'sqlite') env.SQLITE_FILE = path.join(ctx.tmpDir, 'growth.db');
  else {
    const schema = `${ctx.runId}_growth`;
    await pgSchemaUrl(schema);
    Object.assign(env, { PG_URL, PG_SCHEMA: schema });
  }
  return startServer(WORKER, { env });
}

export async function run(ctx) {
  const sizes = ctx.quick ? [1_000, 10_000, 100_000] : [10_000, 1_000_000, 10_000_000];
  const samples = ctx.quick ? 300 : 2000;
  const expired = ctx.quick ? 50_000 : 1_000_000;
  // Setup time per store for pre-filling; a size not reached in it is reported, not faked.
  const fillBudgetMs = (ctx.quick ? 20 : 200) * 1000;
  const rows = [];
  const purgeRows = [];
  const targets = [];
  const notes = [
    `Claim+complete: ${samples} sequential store.claim + store.complete pairs on fresh random UUID keys, timed one by one, in 10 blocks alternating with the same on a reference store (same kind, same process) that stays at ${fmt(sizes[0])} records, so both see the same machine load; the ratio is grown p50 ÷ reference p50.`,
    'Pre-fill: completed, unexpired records by bulk INSERT … SELECT (generate_series / recursive CTE); each fill spreads its keys evenly over the key space and inserts them in ascending order (fast, and new keys still land between old ones), then checkpoints (PostgreSQL: VACUUM ANALYZE + CHECKPOINT) so the timed claims do not pay for the bulk load.',
    `Purge: ${fmt(expired)} records past retention added, then store.purgeExpired() runs in the serving process (as the loan desk's timer does) while autocannon drives POST /orders with fresh keys through retrysafe/node on the same store; p99 before is the same load with no purge.`,
  ];
  const kinds = ['sqlite', 'postgres'];
  const { servers: workers, failed } = await startAll(
    kinds.map((kind) => ({ id: kind, start: () => startWorker(ctx, kind) })),
  );
  for (const kind of kinds) {
    const worker = workers.get(kind);
    try {
      if (!worker) throw new Error(failed.get(kind));
      await worker.ask({ cmd: 'fillReference', total: sizes[0] });
      const fillDeadlineMs = Date.now() + fillBudgetMs;
      const measured = [];
      for (const size of sizes) {
        const filled = await worker.ask({ cmd: 'fill', total: size, deadlineMs: fillDeadlineMs });
        if (filled.stored < size) {
          notes.push(
            `${kind}: pre-filling stopped at ${fmt(filled.stored)} records (setup budget ${fillBudgetMs / 1000} s); ${fmt(size)} not measured.`,
          );
          if (filled.stored > (measured.at(-1)?.size ?? 0)) {
            const m = await worker.ask({ cmd: 'measure', n: samples });
            measured.push({ size: filled.stored, ...m, fillS: filled.ms / 1000 });
          }
          break;
        }
        const m = await worker.ask({ cmd: 'measure', n: samples });
        measured.push({ size, ...m, fillS: filled.ms / 1000 });
        ctx.log(
          `  ${kind} ${fmt(size)}: p50 ${m.p50Ms.toFixed(3)} ms p99 ${m.p99Ms.toFixed(3)} ms, reference p50 ${m.referenceP50Ms.toFixed(3)} ms (fill ${(filled.ms / 1000).toFixed(1)} s)`,
        );
      }
      const last = measured.at(-1);
      for (const m of measured) {
        rows.push([
          kind,
          fmt(m.size),
          m.p50Ms.toFixed(3),
          m.p99Ms.toFixed(3),
          m.referenceP50Ms.toFixed(3),
          round2(m.p50Ms / m.referenceP50Ms),
          round2(m.fillS),
        ]);
      }
      if (last && last.size > sizes[0]) {
        targets.push(
          target(
            `growth: ${kind} claim+complete p50 ${fmt(last.size)} ÷ ${fmt(sizes[0])} (same blocks)`,
            last.p50Ms / last.referenceP50Ms,
            '<=',
            1.2,
          ),
        );
      }

      const added = await worker.ask({
        cmd: 'fillExpired',
        count: expired,
        deadlineMs: Date.now() + fillBudgetMs,
      });
      const url = `${worker.url}/orders`;
      const body = { item: 'book', qty: 1 };
      const before = await loadDuring({ url, body }, () => sleep(ctx.durationS * 1000));
      const during = await loadDuring({ url, body, maxS: 600 }, () => worker.ask({ cmd: 'purge' }));
      const ratio = during.p99Ms / before.p99Ms;
      targets.push(target(`purge: ${kind} p99 during purge ÷ before`, ratio, '<=', 2));
      purgeRows.push([
        kind,
        fmt(added.added),
        during.value.deleted,
        round2(during.value.ms / 1000),
        `${Math.round(before.rps)} / ${Math.round(during.rps)}`,
        `${round2(before.p50Ms)} / ${round2(during.p50Ms)}`,
        `${round2(before.p99Ms)} / ${round2(during.p99Ms)}`,
        round2(ratio),
        `${before.non2xx + during.non2xx}/${before.errors + during.errors}`,
      ]);
      ctx.log(`  ${kind} purge: ${JSON.stringify(purgeRows.at(-1))}`);
    } catch (error) {
      rows.push([kind, `failed: ${error.message.slice(0, 200)}`, null, null, null, null, null]);
      ctx.log(`  ${kind} failed: ${error.message}`);
    } finally {
      // Stopped before the next store is measured, so its shutdown does not run during it.
      await worker?.stop();
    }
  }
  return {
    title: 'Store growth: claim+complete latency as the key table grows; purge under load',
    table: {
      columns: [
        'store',
        'records stored',
        'p50 ms',
        'p99 ms',
        `reference p50 ms (${fmt(sizes[0])} records, same blocks)`,
        'p50 ÷ reference',
        'fill s',
      ],
      rows,
    },
    tables: [
      {
        caption: 'Purging expired keys while serving:',
        columns: [
          'store',
          'expired added',
          'purged',
          'purge s',
          'req/s before / during',
          'p50 ms before / during',
          'p99 ms before / during',
          'p99 ratio',
          'non-2xx/errors',
        ],
        rows: purgeRows,
      },
    ],
    notes,
    targets,
  };
}
