import { rm } from 'node:fs/promises';
import path from 'node:path';
import { Queue, Worker } from 'bullmq';
import { idempotent } from 'retrysafe';
import { memoryStore } from 'retrysafe/memory';
import { redisStore } from 'retrysafe/redis';
import { sqliteStore } from 'retrysafe/sqlite';
import { informational, round2 } from '../lib/measure.js';
import { median } from '../lib/median.js';
import { REDIS_URL } from '../lib/services.js';

/**
 * `idempotent()` off HTTP: µs a `run(input, work)` of a new key adds over calling `work` directly,
 * on the memory, SQLite and Redis stores (lease mode), and a BullMQ worker's jobs/s with and
 * without `idempotent` (Redis store) around its processor, in the same run.
 */
const SLICE = 200;
const work = () => ({ sent: true });

/** µs of wall time per call of `call(i)` over a slice (Redis calls wait on the network). */
async function slice(call, offset) {
  const started = performance.now();
  for (let i = 0; i < SLICE; i++) await call(offset + i);
  return ((performance.now() - started) * 1000) / SLICE;
}

/** Median µs `run` adds per new key over `work` alone, the two taking turns slice by slice. */
async function addedPerRun(store, slices, log, name) {
  const run = idempotent({ store, scope: `bench-${Date.now()}`, key: (job) => job.id });
  const direct = (i) => Promise.resolve(work({ id: `d-${i}` }));
  const guarded = (i) => run({ id: `job-${i}`, data: { n: i } }, work);
  await slice(guarded, -SLICE * 2); // warm-up
  const added = [];
  const guardedUs = [];
  for (let s = 0; s < slices; s++) {
    const bare = await slice(direct, s * SLICE);
    const keyed = await slice(guarded, s * SLICE);
    added.push(keyed - bare);
    guardedUs.push(keyed);
  }
  log(`  ${name}: ${round2(median(guardedUs))} µs per run, ${round2(median(added))} µs added`);
  return { added: median(added), perRun: median(guardedUs), slices: added };
}

/** Jobs per second a BullMQ worker (concurrency 8, in this process) completes `count` jobs at. */
async function bullmqJobsPerSecond(queueName, count, processor) {
  const connection = { host: new URL(REDIS_URL).hostname, port: Number(new URL(REDIS_URL).port || 6379) };
  const queue = new Queue(queueName, { connection });
  await queue.addBulk(
    Array.from({ length: count }, (_, i) => ({ name: 'tiny', data: { n: i }, opts: { jobId: `j-${i}` } })),
  );
  let done = 0;
  let started = 0;
  const finished = new Promise((resolve) => {
    const worker = new Worker(queueName, processor, {
      connection: { ...connection, maxRetriesPerRequest: null },
      concurrency: 8,
    });
    worker.on('active', () => {
      if (started === 0) started = performance.now();
    });
    worker.on('completed', () => {
      done += 1;
      if (done === count) resolve(worker);
    });
  });
  const worker = await finished;
  const seconds = (performance.now() - started) / 1000;
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  return count / seconds;
}

export async function run(ctx) {
  const slices = ctx.quick ? 5 : 25;
  const sqliteFile = path.join(ctx.tmpDir, 'jobs.db');
  const redisPrefix = `${ctx.runId}:jobs:`;
  const stores = {
    memory: memoryStore(),
    sqlite: sqliteStore({ url: sqliteFile, migrate: true }),
    redis: redisStore({ url: REDIS_URL, prefix: redisPrefix }),
  };
  const perStore = {};
  try {
    for (const [name, store] of Object.entries(stores)) {
      perStore[name] = await addedPerRun(store, slices, ctx.log, name);
    }
  } finally {
    for (const store of Object.values(stores)) await store.close();
    await rm(sqliteFile, { force: true });
  }

  const count = ctx.quick ? 500 : 2000;
  const rounds = ctx.quick ? 1 : 3;
  const jobsStore = redisStore({ url: REDIS_URL, prefix: `${redisPrefix}bullmq:` });
  const once = idempotent({
    store: jobsStore,
    scope: 'bench',
    key: (job) => job.id,
    fingerprint: (job) => job.data,
  });
  const rates = { plain: [], idempotent: [] };
  try {
    for (let round = 0; round < rounds; round++) {
      // Alternate which goes first, so drift on a shared machine lands on both.
      const order = round % 2 === 0 ? ['plain', 'idempotent'] : ['idempotent', 'plain'];
      for (const variant of order) {
        const processor =
          variant === 'plain' ? async (job) => work(job) : (job) => once(job, () => work(job));
        const rate = await bullmqJobsPerSecond(`${ctx.runId}_jobs_${variant}_${round}`, count, processor);
        rates[variant].push(rate);
        ctx.log(`  bullmq round ${round + 1}/${rounds} ${variant}: ${Math.round(rate)} jobs/s`);
      }
    }
  } finally {
    await jobsStore.close();
  }
  const plain = median(rates.plain);
  const guarded = median(rates.idempotent);
  const ratio = guarded / plain;
  return {
    title: 'Jobs: idempotent() per run, and a BullMQ worker with and without it',
    table: {
      columns: ['store', 'µs per run (new key)', 'µs added over work alone'],
      rows: Object.entries(perStore).map(([name, r]) => [name, round2(r.perRun), round2(r.added)]),
    },
    tables: [
      {
        caption: `BullMQ worker, concurrency 8, ${count} tiny jobs per round, ${rounds} round(s) each, medians:`,
        columns: ['processor', 'jobs/s'],
        rows: [
          ['work alone', Math.round(plain)],
          ['idempotent (Redis store)', Math.round(guarded)],
          ['ratio', round2(ratio)],
        ],
      },
    ],
    notes: [
      `${slices} slices of ${SLICE} sequential runs per store, each a new key (a first delivery: claim, work, save), taking turns with ${SLICE} direct calls of work; µs of wall time, medians of each slice against the one next to it.`,
      'BullMQ: the worker and the queue in this process, against the same Redis; with idempotent every job also claims and completes its key in that Redis.',
    ],
    targets: [
      informational('jobs: µs added per run, memory store', perStore.memory.added),
      informational('jobs: µs added per run, SQLite store', perStore.sqlite.added),
      informational('jobs: µs added per run, Redis store', perStore.redis.added),
      informational('jobs: BullMQ jobs/s with idempotent ÷ without', ratio),
    ],
    raw: { perStore, rates },
  };
}
