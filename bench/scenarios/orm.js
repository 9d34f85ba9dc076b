import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { load, request } from '../lib/load.js';
import { measureSet, round2, target } from '../lib/measure.js';
import { startAll, startServer, stopAll } from '../lib/proc.js';
import { PG_URL, withPg } from '../lib/services.js';

/** Issue 31's goal: an ORM app keyed (atomic mode) ÷ the same app's keyless POST. */
const GOAL = 0.8;
const ORMS = ['drizzle', 'kysely', 'knex', 'typeorm', 'prisma'];
const examples = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../examples/orm');
const ORDER = { item: 'book' };

/**
 * Each ORM quick start (`examples/orm/<orm>/app.js`, atomic mode on PostgreSQL) measured on itself:
 * a fresh key per request (the claim, the order and the saved answer in the ORM's transaction)
 * against keyless POSTs, which the guard passes straight to the same handler (the order in the
 * ORM's own transaction, no retrysafe statement): the ratio is what retrysafe costs that app.
 */
export async function run(ctx) {
  const present = ORMS.filter((orm) => existsSync(path.join(examples, orm, 'app.js')));
  const database = `${ctx.runId}_orm`;
  await withPg((client) => client.query(`CREATE DATABASE "${database}"`));
  const url = new URL(PG_URL);
  url.pathname = `/${database}`;
  const { servers, failed } = await startAll(
    present.map((orm) => ({
      id: orm,
      start: () =>
        startServer(path.join(examples, orm, 'app.js'), {
          ipcReady: false,
          env: { DATABASE_URL: url.toString() },
        }),
    })),
  );
  try {
    const entries = [];
    for (const orm of present) {
      const server = servers.get(orm);
      if (!server) continue;
      // The first POST creates the tables: measured runs then find them.
      const first = await request(`${server.url}/orders`, {
        body: ORDER,
        headers: { 'idempotency-key': 'warm' },
      });
      if (first.status !== 201) {
        failed.set(orm, `POST /orders answered ${first.status} ${first.text}`);
        continue;
      }
      const orders = `${server.url}/orders`;
      entries.push(
        { id: `${orm}:keyless`, run: (durationS) => load({ url: orders, body: ORDER, durationS }) },
        {
          id: `${orm}:keyed`,
          run: (durationS) => load({ url: orders, body: ORDER, keyed: true, durationS }),
        },
      );
    }
    const measured = await measureSet(entries, ctx);
    const rows = [];
    const targets = [];
    for (const orm of present) {
      const keyless = measured[`${orm}:keyless`];
      const keyed = measured[`${orm}:keyed`];
      const name = `orm: ${orm} keyed ÷ keyless (atomic, PostgreSQL)`;
      if (!keyless || !keyed) {
        rows.push([orm, `unavailable: ${failed.get(orm)?.slice(0, 160)}`]);
        // Still one row per ORM in the targets: a miss that says why it has no figure.
        targets.push({ ...target(name, Number.NaN, '>=', GOAL), detail: 'not measured (see the ORM table)' });
        continue;
      }
      const ratio = keyed.rps / keyless.rps;
      targets.push(target(name, ratio, '>=', GOAL));
      rows.push([
        orm,
        Math.round(keyless.rps),
        Math.round(keyed.rps),
        round2(ratio),
        `${keyless.p50Ms} / ${keyed.p50Ms}`,
        keyed.non2xx + keyed.errors,
      ]);
    }
    return {
      title: 'Each ORM quick start: keyed (atomic mode) ÷ keyless POST /orders, PostgreSQL',
      table: {
        columns: [
          'ORM',
          'keyless req/s',
          'keyed req/s',
          'keyed ÷ keyless',
          'p50 ms keyless / keyed',
          'non-2xx/errors',
        ],
        rows,
      },
      notes: [
        'Keyless: the guard passes the request to the same handler, which writes the order in the ORM’s own transaction; keyed: the claim, the order and the saved answer in that one transaction (atomic mode).',
      ],
      targets,
      raw: measured,
    };
  } finally {
    await stopAll(servers);
    await withPg((client) => client.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`));
  }
}
