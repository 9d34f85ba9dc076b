import { load } from '../lib/load.js';
import { LOAN, profileArgs, startLoanDesk, VARIANTS } from '../lib/loandesk.js';
import { informational, measureSet, pairRow, target } from '../lib/measure.js';
import { startAll, stopAll } from '../lib/proc.js';

const ATOMIC = VARIANTS.find((v) => v.id === 'sqlite-atomic');
/** Issue 33: node:sqlite ≥ 0.8 of better-sqlite3 on the same path (a fresh key, atomic mode). */
const GOAL = 0.8;
const GOAL_NAME = 'sqlite-drivers: POST /loans, fresh key (atomic), node:sqlite ÷ better-sqlite3';

/** The loan desk on SQLite in atomic mode, once per driver of the store (SQLITE_DRIVER). */
const DRIVERS = [
  { ...ATOMIC, id: 'better-sqlite3', driver: 'better-sqlite3' },
  { ...ATOMIC, id: 'node-sqlite', driver: 'node:sqlite' },
];

export async function run(ctx) {
  const [major, minor] = process.versions.node.split('.').map(Number);
  if (major < 22 || (major === 22 && minor < 16)) {
    // Listed as a miss with no figure, so the Targets table says why it has none.
    return {
      title: `SQLite store drivers: node:sqlite ÷ better-sqlite3 (not measured on ${process.version})`,
      notes: [`node:sqlite needs Node ≥ 22.16; this run is on ${process.version}.`],
      targets: [
        { ...target(GOAL_NAME, Number.NaN, '>=', GOAL), detail: `not measured: Node ${process.version}` },
      ],
    };
  }
  const { servers, failed } = await startAll(
    DRIVERS.map((variant) => ({
      id: variant.id,
      start: () =>
        startLoanDesk(ctx, variant, { tag: '-driver', execArgv: profileArgs(ctx, `driver-${variant.id}`) }),
    })),
  );
  try {
    const entries = [];
    for (const variant of DRIVERS) {
      const server = servers.get(variant.id);
      if (!server) throw new Error(`${variant.id} did not start: ${failed.get(variant.id)}`);
      const url = `${server.url}/loans`;
      const key = `${ctx.runId}-driver-${variant.id}`;
      entries.push(
        { id: `${variant.id}:keyless`, run: (durationS) => load({ url, body: LOAN, durationS }) },
        { id: `${variant.id}:fresh`, run: (durationS) => load({ url, body: LOAN, keyed: true, durationS }) },
        {
          id: `${variant.id}:replay`,
          run: (durationS) => load({ url, body: LOAN, fixedKey: key, durationS }),
        },
      );
    }
    const measured = await measureSet(entries, ctx);
    const kinds = [
      ['keyless', 'POST /loans, no key'],
      ['fresh', 'POST /loans, fresh key (atomic)'],
      ['replay', 'replay of one completed key'],
    ];
    const rows = kinds.map(([kind, label]) =>
      pairRow(label, measured[`better-sqlite3:${kind}`], measured[`node-sqlite:${kind}`]),
    );
    return {
      title: `SQLite store drivers on ${process.version}: node:sqlite ÷ better-sqlite3, the loan desk in atomic mode`,
      table: {
        columns: [
          'request',
          'better-sqlite3 req/s',
          'node:sqlite req/s',
          'node:sqlite ÷ better-sqlite3',
          'p50 ms (better / node)',
          'p99 ms (better / node)',
          'non-2xx/errors',
        ],
        rows,
      },
      notes: [
        'The same loan desk (examples/library-loans) with SQLITE_DRIVER=better-sqlite3 and SQLITE_DRIVER=node:sqlite: the store, the loans and the read connection all on that driver, measured in the same interleaved rounds.',
      ],
      targets: kinds.map(([kind, label]) => {
        const ratio = measured[`node-sqlite:${kind}`].rps / measured[`better-sqlite3:${kind}`].rps;
        return kind === 'fresh'
          ? target(GOAL_NAME, ratio, '>=', GOAL)
          : informational(`sqlite-drivers: ${label}, node:sqlite ÷ better-sqlite3`, ratio);
      }),
      raw: measured,
    };
  } finally {
    await stopAll(servers);
  }
}
