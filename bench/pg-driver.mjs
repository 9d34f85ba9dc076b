// Which PostgreSQL driver should retrysafe/postgres use? Runs the store's claim + complete round
// trips (same SQL, same table, same concurrency) on `pg` (Pool, unnamed and named/prepared
// statements) and on `postgres` (postgres.js, prepared by default), and prints ops/s per driver.
// Usage: node bench/pg-driver.mjs [ops=5000] [concurrency=10]   (DATABASE_URL overrides the URL)
import { randomBytes, randomUUID } from 'node:crypto';
import pg from 'pg';
import postgres from 'postgres';
import { postgresStore } from 'retrysafe/postgres';

const URL = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const OPS = Number(process.argv[2] ?? 5000);
const CONCURRENCY = Number(process.argv[3] ?? 10);
const ROUNDS = 3;
const schema = `rs_bench_${randomBytes(4).toString('hex')}`;

// The store's own claim and complete statements, as it sends them to its pool: recorded from a
// claim and a completion of a real store, so this compares drivers on the SQL retrysafe/postgres
// runs today (its table made by its own migrate()).
const sent = [];
const recorder = new pg.Pool({ connectionString: URL, max: 1 });
const poolQuery = recorder.query.bind(recorder);
recorder.query = (config, ...rest) => {
  if (typeof config === 'object') sent.push(config);
  return poolQuery(config, ...rest);
};
const probe = postgresStore({ pool: recorder, schema });
await probe.migrate();
const probed = await probe.claim({
  scope: 'bench',
  key: 'probe',
  fingerprint: 'f',
  leaseMs: 30_000,
  retainMs: 60_000,
});
await probe.complete('bench', 'probe', probed.token, { status: 201, headers: {}, body: Buffer.alloc(0) });
await probe.close();
await recorder.end();
const statementNamed = (prefix) => sent.find((config) => config.name?.startsWith(prefix));
const CLAIM = statementNamed('retrysafe_claim_').text;
const completed = statementNamed('retrysafe_complete_');
const COMPLETE = completed.text;
// The completion's NOTIFY channel and payload, as the store sent them.
const [channel, notified] = completed.values.slice(6);

const admin = new pg.Client({ connectionString: URL });
await admin.connect();

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
        await complete(['bench', key, token, 201, headers, body, channel, notified]);
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
