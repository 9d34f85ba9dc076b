import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { burst, load, request } from '../lib/load.js';
import { informational, measureSet, round2, target } from '../lib/measure.js';
import { median } from '../lib/median.js';
import { startAll, startServer, stopAll } from '../lib/proc.js';
import { REDIS_URL } from '../lib/services.js';

const SERVERS = path.join(path.dirname(fileURLToPath(import.meta.url)), '../servers');
const APP = path.join(SERVERS, 'express-app.js');
const HONO_APP = path.join(SERVERS, 'hono-app.js');
const NEST_APP = path.join(SERVERS, 'nest-app.js');
/** The handler delay for the race probes: long enough that 20 duplicates overlap it. */
const RACE_DELAY_MS = 50;
const DUPLICATES = 20;

const CONTENDERS = [
  { id: 'bare', label: 'bare Express 5 (no idempotency)' },
  { id: 'express-idempotency-memory', label: 'express-idempotency (memory)' },
  { id: 'express-idempotency-redis', label: 'express-idempotency (Redis adapter)' },
  { id: 'node-idempotency-memory', label: '@node-idempotency/core (memory)' },
  { id: 'node-idempotency-redis', label: '@node-idempotency/core (Redis)' },
  { id: 'powertools-redis', label: 'Powertools idempotency (Redis, makeIdempotent)' },
  // Issue 33: memory ≥ 0.95 of bare Express; Redis reported against bare. Issue 25: memory and
  // Redis each ahead of @node-idempotency on the same store, the fastest peer measured: the median
  // over the rounds of each round's throughput ratio ≥ 1 (the rounds interleave the contenders, so
  // a round's two figures share the machine's load).
  {
    id: 'retrysafe-memory',
    label: 'retrysafe (memory)',
    ours: true,
    goal: 0.95,
    ahead: 'node-idempotency-memory',
  },
  {
    id: 'retrysafe-redis',
    label: 'retrysafe (Redis)',
    ours: true,
    reported: true,
    ahead: 'node-idempotency-redis',
  },
  { id: 'retrysafe-sqlite', label: 'retrysafe (SQLite)', ours: true },
  // The NestJS row: its own app and its own baseline, measured interleaved with the rest.
  { id: 'nest-bare', label: 'bare NestJS 12 (no idempotency)', app: NEST_APP, bare: 'nest-bare' },
  {
    id: 'nest-node-idempotency-memory',
    label: '@node-idempotency/nestjs (memory)',
    app: NEST_APP,
    bare: 'nest-bare',
  },
  {
    id: 'nest-retrysafe-memory',
    label: 'retrysafe/nestjs (memory)',
    ours: true,
    app: NEST_APP,
    bare: 'nest-bare',
  },
  // Issue 33: Hono + SQLite reported against bare Hono, the handler writing one order in SQLite.
  { id: 'hono-bare', label: 'bare Hono 4 (order in SQLite)', app: HONO_APP, bare: 'hono-bare' },
  {
    id: 'hono-retrysafe-sqlite',
    label: 'retrysafe/hono (SQLite, atomic: the order on ctx.tx)',
    ours: true,
    reported: true,
    app: HONO_APP,
    bare: 'hono-bare',
  },
];

const BODY = { item: 'book', qty: 1 };

function serverEnv(ctx, id) {
  return { CONTENDER: id, RUN_ID: ctx.runId, REDIS_URL, SQLITE_FILE: path.join(ctx.tmpDir, `${id}.db`) };
}

function execArgv(ctx, id) {
  if (!ctx.profileDir || !id.includes('retrysafe')) return [];
  return ['--cpu-prof', `--cpu-prof-dir=${ctx.profileDir}`, `--cpu-prof-name=peers-${id}.cpuprofile`];
}

const describe = (r) => {
  const replayed = r.headers['idempotency-replayed'] ? ' (replayed)' : '';
  let error = '';
  try {
    const body = JSON.parse(r.text);
    if (body.error) error = ` ${body.error}`;
  } catch {}
  return `${r.status}${replayed}${error}`;
};

/** Runs on the contender's throughput server once its runs are over, with a slow handler. */
async function probe(ctx, contender, server) {
  await server.ask({ cmd: 'delay', ms: RACE_DELAY_MS });
  const url = `${server.url}/orders`;
  const key = (name) => `${ctx.runId}-${contender.id}-${name}`;
  const before = await server.ask({ cmd: 'stats' });
  const race = await burst(url, DUPLICATES, { body: BODY, headers: { 'idempotency-key': key('race') } });
  // Let stragglers (a library that answered early and completes in the background) finish.
  await new Promise((resolve) => setTimeout(resolve, 300));
  const after = await server.ask({ cmd: 'stats' });
  const statuses = {};
  for (const r of race.responses) statuses[r.status] = (statuses[r.status] ?? 0) + 1;
  const firstBody = race.responses.find((r) => r.status < 300)?.text;
  const distinctBodies = new Set(race.responses.filter((r) => r.status < 300).map((r) => r.text)).size;

  const retry = await request(url, { body: BODY, headers: { 'idempotency-key': key('race') } });
  const mismatch = await request(url, {
    body: { item: 'another book', qty: 2 },
    headers: { 'idempotency-key': key('race') },
  });
  const crashBody = { ...BODY, crashOnce: key('crash') };
  const crash = await request(url, { body: crashBody, headers: { 'idempotency-key': key('crash') } });
  await new Promise((resolve) => setTimeout(resolve, 100));
  const crashRetry = await request(url, { body: crashBody, headers: { 'idempotency-key': key('crash') } });
  return {
    executions: after.executions - before.executions,
    statuses,
    distinctBodies,
    failures: race.failures.length,
    retry: describe(retry),
    retrySameBody: retry.text === firstBody,
    mismatch: describe(mismatch),
    crash: describe(crash),
    crashRetry: describe(crashRetry),
  };
}

export async function run(ctx) {
  const notes = [
    `Same Express 5 app and handler for every Express contender (bench/servers/express-app.js); the NestJS rows share one NestJS 12 app on platform-express (bench/servers/nest-app.js) around the same handler (bench/servers/work.js), and their ÷ bare is against bare NestJS; the Hono rows (bench/servers/hono-app.js, @hono/node-server) write the handler's order in SQLite, bare on the app's own connection, guarded on ctx.tx in the transaction of the claim and the saved answer (atomic mode), and their ÷ bare is against bare Hono; JSON body ${JSON.stringify(BODY)}, a fresh Idempotency-Key per request, also sent to the bare app (which ignores it).`,
    `Correctness probes run on the same servers once the throughput runs are over, with a ${RACE_DELAY_MS} ms handler: ${DUPLICATES} concurrent duplicates on one key, then a plain retry, then the same key with another body, then a handler that throws once and its retry.`,
    '@node-idempotency/express is not published on npm (404); the bench uses @node-idempotency/core with the same glue its Express plugin source uses (onRequest, onResponse from res.send, replay of status and body).',
    '@node-idempotency/nestjs 1.0.4 declares NestJS 9 or 10 as peers; it runs here on NestJS 12 (bench/package.json overrides the peer range), integrated as its README says (NodeIdempotencyModule.forRootAsync with the memory adapter, @Idempotent() on the route).',
    'Powertools: makeIdempotent over CachePersistenceLayer (@redis/client) in the Express handler, eventKeyJmesPath "key", payloadValidationJmesPath "body"; no Lambda context (so no in-progress expiry).',
  ];
  const { servers, failed: unavailable } = await startAll(
    CONTENDERS.map((contender) => ({
      id: contender.id,
      start: () =>
        startServer(contender.app ?? APP, {
          env: serverEnv(ctx, contender.id),
          execArgv: execArgv(ctx, contender.id),
        }),
    })),
  );
  for (const [id, message] of unavailable) ctx.log(`  ${id} unavailable: ${message}`);
  const rows = [];
  try {
    const entries = CONTENDERS.filter((c) => servers.has(c.id)).map((c) => ({
      id: c.id,
      run: (durationS) =>
        load({ url: `${servers.get(c.id).url}/orders`, body: BODY, keyed: true, durationS }),
    }));
    const measured = await measureSet(entries, ctx);

    const targets = [];
    for (const contender of CONTENDERS) {
      const m = measured[contender.id];
      let p = null;
      if (servers.has(contender.id)) {
        try {
          p = await probe(ctx, contender, servers.get(contender.id));
        } catch (error) {
          unavailable.set(contender.id, error.message);
        }
      }
      const bare = measured[contender.bare ?? 'bare']?.rps;
      const ratio = m && bare ? m.rps / bare : Number.NaN;
      if (contender.goal)
        targets.push(target(`peers: ${contender.label} throughput ÷ bare`, ratio, '>=', contender.goal));
      if (contender.reported)
        targets.push(informational(`peers: ${contender.label} throughput ÷ bare`, ratio));
      if (contender.ahead) {
        const peer = CONTENDERS.find((c) => c.id === contender.ahead);
        const peerRounds = measured[contender.ahead]?.rounds;
        const perRound = m && peerRounds ? m.rounds.map((rps, i) => rps / peerRounds[i]) : [];
        targets.push(
          target(
            `peers: ${contender.label} ÷ ${peer.label} throughput, median of ${perRound.length} interleaved rounds`,
            median(perRound),
            '>=',
            1,
          ),
        );
      }
      rows.push([
        contender.label,
        m
          ? Math.round(m.rps)
          : unavailable.get(contender.id)
            ? `unavailable: ${unavailable.get(contender.id).slice(0, 120)}`
            : null,
        round2(ratio),
        round2(m?.p50Ms),
        round2(m?.p99Ms),
        m ? `${m.non2xx}/${m.errors}` : null,
        m ? m.rounds.join(', ') : null,
        p ? `${p.executions} of ${DUPLICATES}` : null,
        p
          ? Object.entries(p.statuses)
              .map(([s, n]) => `${n}×${s}`)
              .join(', ') + (p.failures ? `, ${p.failures} failed` : '')
          : null,
        p ? `${p.retry}${p.retrySameBody ? '' : ' (different body)'}` : null,
        p?.mismatch,
        p ? `${p.crash} → ${p.crashRetry}` : null,
      ]);
      ctx.log(`  ${contender.id}: ${JSON.stringify({ ratio: round2(ratio), ...p })}`);
    }
    return {
      title: 'Peers side by side (Express 5, NestJS 12 and Hono 4, same handler)',
      table: {
        columns: [
          'contender',
          'req/s',
          '÷ bare',
          'p50 ms',
          'p99 ms',
          'non-2xx/errors',
          'req/s per round',
          'executions of 20 concurrent duplicates',
          'their statuses',
          'plain retry after success',
          'same key, other body',
          'handler crash → retry',
        ],
        rows,
      },
      notes,
      targets,
      raw: measured,
    };
  } finally {
    await stopAll(servers);
  }
}
