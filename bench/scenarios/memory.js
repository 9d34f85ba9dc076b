import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { load } from '../lib/load.js';
import { round2 } from '../lib/measure.js';
import { startAll, startServer } from '../lib/proc.js';

const APP = path.join(path.dirname(fileURLToPath(import.meta.url)), '../servers/express-app.js');
const MB = 1024 * 1024;

export async function run(ctx) {
  // 100k since issue 33 added scenarios to the full run (200k before; not one of its targets).
  const total = ctx.quick ? 5_000 : 100_000;
  const rows = [];
  const contenders = ['retrysafe-sqlite', 'bare'];
  const { servers, failed: unstarted } = await startAll(
    contenders.map((contender) => ({
      id: contender,
      start: () =>
        startServer(APP, {
          env: {
            CONTENDER: contender,
            RUN_ID: ctx.runId,
            SQLITE_FILE: path.join(ctx.tmpDir, `memory-${contender}.db`),
          },
          execArgv: ['--expose-gc'],
        }),
    })),
  );
  for (const contender of contenders) {
    const server = servers.get(contender);
    try {
      if (!server) throw new Error(unstarted.get(contender));
      const url = `${server.url}/orders`;
      const body = { item: 'book', qty: 1 };
      await load({ url, body, keyed: true, amount: ctx.quick ? 1000 : 5000 });
      const before = await server.ask({ cmd: 'stats' });
      const started = performance.now();
      // Four quarters, with RSS read after each: bounded growth flattens, a leak keeps climbing.
      const rssAfterMb = [];
      let ok = 0;
      let failed = 0;
      for (let quarter = 0; quarter < 4; quarter++) {
        const result = await load({ url, body, keyed: true, amount: total / 4 });
        ok += result.ok;
        failed += result.non2xx + result.errors;
        rssAfterMb.push(round2((await server.ask({ cmd: 'stats' })).rssBytes / MB));
      }
      const seconds = (performance.now() - started) / 1000;
      const after = await server.ask({ cmd: 'stats' });
      rows.push([
        contender === 'bare' ? 'bare Express (reference)' : 'retrysafe (SQLite store)',
        ok,
        round2(seconds),
        round2(before.rssBytes / MB),
        rssAfterMb.join(' → '),
        round2((after.rssBytes - before.rssBytes) / MB),
        `${round2(before.heapUsedBytes / MB)} → ${round2(after.heapUsedBytes / MB)}`,
        failed,
      ]);
      ctx.log(`  ${contender}: ${JSON.stringify(rows.at(-1))}`);
    } catch (error) {
      rows.push([contender, `failed: ${error.message.slice(0, 200)}`, null, null, null, null, null, null]);
      ctx.log(`  ${contender} failed: ${error.message}`);
    } finally {
      await server?.stop();
    }
  }
  return {
    title: `Memory: RSS before and after ${total / 1000}k unique-key requests`,
    table: {
      columns: [
        'server',
        '2xx responses',
        'seconds',
        'RSS MB before',
        'RSS MB after each quarter',
        'RSS growth MB',
        'heap used MB (after GC)',
        'non-2xx + errors',
      ],
      rows,
    },
    notes: [
      'The same Express app as the peers scenario; "before" is after 5,000 warm-up requests (1,000 with --quick), both readings after a forced GC (--expose-gc). The bare app shows what Express and the runtime grow by on their own.',
    ],
    targets: [],
  };
}
