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

const NOW = `(extract(epoch from clock_timestamp()) * 1000)::bigint`;
const CLAIM = `INSERT INTO ${schema}.rec AS r (scope, key, fingerprint, state, owner_token, lease_until_ms, created_at_ms, expires_at_ms)
  SELECT $1, $2, $3, 'in_progress', $4, n.ms + $5, n.ms, n.ms + $6 FROM (SELECT ${NOW} AS ms) n
  ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, state = 'in_progress',
    owner_token = excluded.owner_token, lease_until_ms = excluded.lease_until_ms,
    created_at_ms = excluded.created_at_ms, expires_at_ms = excluded.expires_at_ms
  WHERE r.expires_at_ms <= excluded.created_at_ms
  RETURNING owner_token`;
const COMPLETE = `UPDATE ${schema}.rec SET state = 'completed', response_status = $4, response_headers = $5,
  response_body = $6, lease_until_ms = NULL WHERE scope = $1 AND key = $2 AND owner_token = $3`;

const admin = new pg.Client({ connectionString: URL });
await admin.connect();
await admin.query(`CREATE SCHEMA ${schema}; CREATE TABLE ${schema}.rec (scope text NOT NULL, key text NOT NULL,
  fingerprint text NOT NULL, state text NOT NULL, owner_token text, lease_until_ms bigint,
  response_status integer, response_headers jsonb, response_body bytea, created_at_ms bigint NOT NULL,
  expires_at_ms bigint NOT NULL, PRIMARY KEY (scope, key));
  CREATE INDEX ON ${schema}.rec (expires_at_ms)`);

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
