// Which PostgreSQL driver should retrysafe/postgres use? Runs the store's claim + complete round
// trips (same SQL, same table, same concurrency) on `pg` (Pool, unnamed and named/prepared
// statements) and on `postgres` (postgres.js, prepared by default), and prints ops/s per driver.
// Usage: node bench/pg-driver.mjs [ops=5000] [concurrency=10]   (DATABASE_URL overrides the URL)
import { randomBytes, randomUUID } from 'node:crypto';
import pg from 'pg';
import postgres from 'postgres';

const URL = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const OPS = Number(process.argv[2] ?? 5000);
const CONCURRENCY = Number(process.argv[3] ?? 10);
const ROUNDS = 3;
const schema = `rs_bench_${randomBytes(4).toString('hex')}`;

const NOW = `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`;
const T = `${schema}.idempotency_keys`;
// The statements of src/stores/postgres/index.ts (claim of a new key, complete with its NOTIFY).
const CLAIM = `WITH n AS (SELECT ${NOW} AS ms),
  ins AS (
    INSERT INTO ${T} (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
    SELECT $1, $2, $3, $4, n.ms + $5, n.ms, n.ms + GREATEST($5, $6) FROM n
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING token)
  SELECT true AS acquired, NULL AS fingerprint, false AS completed, NULL AS lease_left_ms,
    false AS claimable, NULL::integer AS status, NULL::json AS headers, NULL::bytea AS body
  FROM ins
  UNION ALL
  SELECT false, fingerprint, completed_at_ms IS NOT NULL, lease_until_ms - n.ms,
    expires_at_ms <= n.ms OR (completed_at_ms IS NULL AND lease_until_ms <= n.ms AND fingerprint = $3),
    status, headers, body
  FROM ${T}, n
  WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM ins)`;
const COMPLETE = `WITH n AS (SELECT ${NOW} AS ms), done AS (
    UPDATE ${T} SET completed_at_ms = n.ms, status = $4, headers = $5, body = $6 FROM n
    WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > n.ms
    RETURNING 1)
  SELECT pg_notify('retrysafe_bench', $2) FROM done`;

const admin = new pg.Client({ connectionString: URL });
await admin.connect();
await admin.query(`CREATE SCHEMA ${schema}; CREATE TABLE ${T} (scope text NOT NULL, key text NOT NULL,
  fingerprint text NOT NULL, token text NOT NULL, lease_until_ms bigint NOT NULL,
  created_at_ms bigint NOT NULL, expires_at_ms bigint NOT NULL, completed_at_ms bigint,
  status integer, headers json, body bytea, PRIMARY KEY (scope, key));
  CREATE INDEX ON ${T} (expires_at_ms)`);

const body = Buffer.from(JSON.stringify({ id: 'L-1', member: 'U-1001', isbn: 'K-01' }));
const headers = JSON.stringify({ 'content-type': 'application/json' });

async function run(claim, complete) {
  let next = 0;
  const prefix = randomUUID();
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < OPS) {
        const key = `${prefix}-${next++}`;
        const token = randomUUID();
        await claim(['bench', key, 'f'.repeat(64), token, 30_000, 86_400_000]);
        await complete(['bench', key, token, 201, headers, body]);
      }
    }),
  );
  return (OPS / (performance.now() - started)) * 1000;
}

const pool = new pg.Pool({ connectionString: URL, max: CONCURRENCY });
const sql = postgres(URL, { max: CONCURRENCY, onnotice: () => {} });
const contenders = {
  'pg (unnamed)': [(v) => pool.query(CLAIM, v), (v) => pool.query(COMPLETE, v)],
  'pg (named)': [
    (v) => pool.query({ name: 'claim', text: CLAIM, values: v }),
    (v) => pool.query({ name: 'complete', text: COMPLETE, values: v }),
  ],
  'postgres.js': [
    (v) => sql.unsafe(CLAIM, v, { prepare: true }),
    (v) => sql.unsafe(COMPLETE, v, { prepare: true }),
  ],
};
const results = Object.fromEntries(Object.keys(contenders).map((k) => [k, []]));
try {
  for (const [claim, complete] of Object.values(contenders)) await run(claim, complete); // warm-up
  for (let round = 0; round < ROUNDS; round++) {
    for (const [label, [claim, complete]] of Object.entries(contenders)) {
      results[label].push(await run(claim, complete));
    }
  }
} finally {
  await pool.end();
  await sql.end();
  await admin.query(`DROP SCHEMA ${schema} CASCADE`);
  await admin.end();
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log(
  `${OPS} claim+complete pairs, ${CONCURRENCY} concurrent, median of ${ROUNDS} rounds (ops = pairs/s)`,
);
for (const [label, xs] of Object.entries(results)) {
  console.log(
    `${label.padEnd(14)} ${median(xs).toFixed(0).padStart(6)} pairs/s   rounds: ${xs.map((x) => x.toFixed(0)).join(', ')}`,
  );
}
