import { burst, sequentialLatency } from '../lib/load.js';
import { LOAN, startLoanDesk, VARIANTS } from '../lib/loandesk.js';
import { round2, target } from '../lib/measure.js';
import { startAll } from '../lib/proc.js';

export async function run(ctx) {
  const concurrent = 1000;
  const rows = [];
  const targets = [];
  const { servers, failed } = await startAll(
    VARIANTS.map((variant) => ({
      id: variant.id,
      start: () => startLoanDesk(ctx, variant, { tag: '-hot' }),
    })),
  );
  for (const variant of VARIANTS) {
    const server = servers.get(variant.id);
    try {
      if (!server) throw new Error(failed.get(variant.id));
      const url = `${server.url}/loans`;
      const single = await sequentialLatency(url, ctx.quick ? 20 : 100, {
        body: LOAN,
        keyPrefix: `${ctx.runId}-hot-single-${variant.id}`,
      });
      const unkeyed = await burst(url, concurrent, { body: LOAN });
      const before = await server.countLoans();
      const hot = await burst(url, concurrent, {
        body: LOAN,
        headers: { 'idempotency-key': `${ctx.runId}-hot-${variant.id}` },
      });
      const executions = (await server.countLoans()) - before;
      const statuses = {};
      for (const r of hot.responses) statuses[r.status] = (statuses[r.status] ?? 0) + 1;
      const bodies = new Set(hot.responses.filter((r) => r.status < 300).map((r) => r.text));
      const counts = new Map();
      for (const r of hot.responses) {
        const shape = `${r.status} ${r.text}`;
        counts.set(shape, (counts.get(shape) ?? 0) + 1);
      }
      const identical = Math.max(0, ...counts.values());
      targets.push(
        target(`hot key: ${variant.label}: executions`, executions, '==', 1),
        target(
          `hot key: ${variant.label}: identical responses of ${concurrent}`,
          identical,
          '==',
          concurrent,
        ),
      );
      rows.push([
        variant.label,
        executions,
        Object.entries(statuses)
          .map(([s, n]) => `${n}×${s}`)
          .join(', ') + (hot.failures.length ? `, ${hot.failures.length} failed (${hot.failures[0]})` : ''),
        bodies.size,
        Math.round(hot.drainMs),
        Math.round(unkeyed.drainMs),
        round2(single.p50Ms),
        round2(hot.drainMs / single.p50Ms),
      ]);
      ctx.log(`  ${variant.id}: ${JSON.stringify(rows.at(-1))}`);
    } catch (error) {
      rows.push([
        variant.label,
        `failed: ${error.message.slice(0, 160)}`,
        null,
        null,
        null,
        null,
        null,
        null,
      ]);
      ctx.log(`  ${variant.id} failed: ${error.message}`);
    } finally {
      // Stopped before the next burst, so its shutdown does not run during it.
      await server?.stop();
    }
  }
  return {
    title: `Hot key: ${concurrent} concurrent requests on one key`,
    table: {
      columns: [
        'store',
        'loans created',
        'statuses',
        'distinct 2xx bodies',
        'drain ms',
        `drain ms, ${concurrent} without key`,
        'one request p50 ms',
        'drain ÷ one request',
      ],
      rows,
    },
    notes: [
      `${concurrent} requests with the same key and body, each on its own connection opened beforehand, written in one go (so the drain time is the server's, not 1,000 TCP handshakes'); "loans created" counts rows in the loan table before and after. One request p50 is of sequential requests with fresh keys on one keep-alive connection. The same burst without a key (${concurrent} new loans) is the reference for what ${concurrent} simultaneous requests cost this server anyway.`,
    ],
    targets,
  };
}
