// Stores under growth: pre-fills one with bulk SQL while a second (the reference) stays at the
// smallest size, times claim+complete on both in alternating blocks through the stores' own API,
// and serves POST /orders through retrysafe/node on the grown store so a purge can run under load.
// KIND=sqlite (SQLITE_FILE) or KIND=postgres (PG_URL, PG_SCHEMA). Commands arrive over IPC.
import { randomBytes, randomUUID } from 'node:crypto';
import http from 'node:http';
import Database from 'better-sqlite3';
import pg from 'pg';
import { idempotency } from 'retrysafe/node';
import { percentile } from '../lib/load.js';
import { serveCommands } from '../lib/proc.js';

const KIND = process.env.KIND;
const DAY_MS = 24 * 60 * 60 * 1000;
/** Rows per bulk statement: big enough to be fast, small enough to stop near a deadline. */
const SQLITE_CHUNK = 250_000;
const PG_CHUNK = 500_000;
/** Timed pairs alternate between the stores in blocks this long, so both see the same machine. */
const BLOCKS = 10;
const RESPONSE = { status: 201, headers: { 'content-type': 'application/json' } };
// A growth fill spreads its keys evenly over the whole key space (12 hex digits, then random ones)
// and inserts them in ascending order: every new key lands between existing ones, as random client
// keys would, but the index is walked in order, which lets a 10M fill fit the run's time budget.
// The expired records for the purge get truly random keys: a purge deletes in expiry order, and
// key order correlated with it would make its index deletes unrealistically local.
const KEY_SPACE = 2 ** 48;

async function openSqlite(filename) {
  const { sqliteStore } = await import('retrysafe/sqlite');
  const store = sqliteStore({ url: filename, migrate: true });
  // The table first: the filler's statement names it (migrate: true alone makes it on first use).
  await store.migrate();
  // A second connection for the bulk fill, with a large cache: the fill is setup, not measured.
  const filler = new Database(filename);
  filler.pragma('cache_size = -1000000');
  const insert =
    filler.prepare(`WITH RECURSIVE g(n) AS (SELECT @start UNION ALL SELECT n + 1 FROM g WHERE n < @end)
    INSERT INTO idempotency_keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms,
      completed_at_ms, status, headers, body)
    SELECT '', CASE WHEN @step = 0 THEN lower(hex(randomblob(16)))
        ELSE printf('%012x', @offset + n * @step) || lower(hex(randomblob(10))) END, lower(hex(randomblob(32))),
      'fill', @createdMs, @createdMs, @expiresMs, @createdMs, 201, '{"content-type":"application/json"}',
      CAST('{"id":' || n || ',"member":"U-1001","isbn":"K-01"}' AS BLOB) FROM g`);
  return {
    store,
    chunk: SQLITE_CHUNK,
    bulk: async (values) => insert.run(values),
    // The WAL the bulk fill left is checkpointed now, not during the timed claims.
    settle: async () => filler.pragma('wal_checkpoint(TRUNCATE)'),
    close: async () => filler.close(),
  };
}

async function openPostgres(schema) {
  const { postgresStore } = await import('retrysafe/postgres');
  const store = postgresStore({ url: process.env.PG_URL, schema });
  await store.migrate();
  const client = new pg.Client({ connectionString: process.env.PG_URL });
  await client.connect();
  return {
    store,
    chunk: PG_CHUNK,
    bulk: ({ start, end, step, offset, createdMs, expiresMs }) =>
      client.query(
        `INSERT INTO "${schema}".idempotency_keys (scope, key, fingerprint, token, lease_until_ms, created_at_ms,
          expires_at_ms, completed_at_ms, status, headers, body)
        SELECT '', CASE WHEN $3::bigint = 0 THEN md5(random()::text || g)
            ELSE lpad(to_hex($4::bigint + g * $3::bigint), 12, '0') || substr(md5(random()::text), 1, 20) END,
          md5(random()::text) || md5(g::text), 'fill', $5, $5, $6, $5, 201, '{"content-type":"application/json"}',
          convert_to('{"id":' || g || ',"member":"U-1001","isbn":"K-01"}', 'UTF8')
        FROM generate_series($1::bigint, $2::bigint) g`,
        [start, end, step, offset, createdMs, expiresMs],
      ),
    // A bulk fill leaves dirty buffers, a WAL backlog and an autovacuum due; a table that grew
    // over days would have none of them, so they are paid here, not during the timed claims.
    settle: async () => {
      await client.query(`VACUUM (ANALYZE) "${schema}".idempotency_keys`);
      await client.query('CHECKPOINT');
    },
    close: () => client.end(),
  };
}

const open = (suffix) =>
  KIND === 'sqlite'
    ? openSqlite(process.env.SQLITE_FILE.replace(/\.db$/, `${suffix}.db`))
    : openPostgres(`${process.env.PG_SCHEMA}${suffix}`);
const grown = await open('');
const reference = await open('_ref');
grown.stored = 0;
reference.stored = 0;

async function fill(target, rows, expiresInMs, deadlineMs, { ordered }) {
  const step = ordered ? Math.floor(KEY_SPACE / Math.max(rows, 1)) : 0;
  const offset = Math.floor(Math.random() * step);
  let done = 0;
  while (done < rows && Date.now() < deadlineMs) {
    const now = Date.now();
    const n = Math.min(target.chunk, rows - done);
    await target.bulk({
      start: done,
      end: done + n - 1,
      step,
      offset,
      createdMs: expiresInMs < 0 ? now - DAY_MS : now,
      expiresMs: now + expiresInMs,
    });
    done += n;
  }
  await target.settle();
  return done;
}

const body = Buffer.from(JSON.stringify({ id: 1, member: 'U-1001', isbn: 'K-01' }));

async function claimComplete(store) {
  const key = randomUUID();
  const started = performance.now();
  const claim = await store.claim({
    scope: '',
    key,
    fingerprint: randomBytes(32).toString('hex'),
    leaseMs: 30_000,
    retainMs: 30 * DAY_MS,
  });
  if (claim.outcome !== 'acquired') throw new Error(`claim of a fresh key answered ${claim.outcome}`);
  await store.complete('', key, claim.token, { ...RESPONSE, body });
  return performance.now() - started;
}

const guard = idempotency({ store: grown.store });
const server = http.createServer(
  guard((_req, res) => {
    res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ id: randomUUID() }));
  }),
);
server.listen(0, '127.0.0.1', () => process.send({ ready: server.address().port }));

serveCommands({
  /** Fills the reference store to `total` live records; it stays at that size. */
  async fillReference({ total }) {
    reference.stored += await fill(reference, total, 30 * DAY_MS, Number.POSITIVE_INFINITY, {
      ordered: true,
    });
    return { stored: reference.stored };
  },
  /** Adds live (unexpired, completed) records until `total` are stored or the deadline passes. */
  async fill({ total, deadlineMs }) {
    const started = performance.now();
    grown.stored += await fill(grown, total - grown.stored, 30 * DAY_MS, deadlineMs, { ordered: true });
    return { stored: grown.stored, ms: performance.now() - started };
  },
  /** Adds `count` completed records whose retention has already passed. */
  async fillExpired({ count, deadlineMs }) {
    const started = performance.now();
    const added = await fill(grown, count, -60_000, deadlineMs, { ordered: false });
    return { added, ms: performance.now() - started };
  },
  /**
   * `n` sequential claim + complete pairs on fresh keys in each store, in alternating blocks, timed
   * one by one. The reference grows only by these pairs (a few thousand records over a run).
   */
  async measure({ n }) {
    // The first pairs open pool connections and prepare statements; they are not timed.
    for (let i = 0; i < 50; i++) {
      await claimComplete(grown.store);
      await claimComplete(reference.store);
    }
    const times = { grown: [], reference: [] };
    const block = Math.max(1, Math.floor(n / BLOCKS));
    for (let b = 0; b < BLOCKS; b++) {
      const order = b % 2 === 0 ? ['grown', 'reference'] : ['reference', 'grown'];
      for (const name of order) {
        const target = name === 'grown' ? grown : reference;
        for (let i = 0; i < block; i++) times[name].push(await claimComplete(target.store));
      }
    }
    grown.stored += 50 + block * BLOCKS;
    return {
      p50Ms: percentile(times.grown, 50),
      p99Ms: percentile(times.grown, 99),
      referenceP50Ms: percentile(times.reference, 50),
      referenceP99Ms: percentile(times.reference, 99),
    };
  },
  /** The store's own purge, with its default batch size unless `batchSize` is given. */
  async purge({ batchSize }) {
    const started = performance.now();
    const deleted = await grown.store.purgeExpired(batchSize);
    return { deleted, ms: performance.now() - started };
  },
});

process.on('SIGTERM', async () => {
  server.close();
  server.closeAllConnections();
  for (const target of [grown, reference]) {
    await target.store.close().catch(() => {});
    await target.close();
  }
  process.exit(0);
});
