import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { AckPolicy, jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connect as natsConnect } from '@nats-io/transport-node';
import amqp from 'amqplib';
import { Queue } from 'bullmq';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { postgresStore } from '../src/stores/postgres/index.js';
import { sqliteStore } from '../src/stores/sqlite/index.js';
import {
  dropSchemas,
  hasPostgres,
  hasRedis,
  PG_URL,
  requireService,
  uniqueName,
} from './support/services.js';
import { sqliteRows } from './support/sqlite-rows.js';

/**
 * 500 jobs per broker, each one's effect a row written through ctx.tx (`idempotent` in atomic
 * mode), consumed by worker processes (test/fixtures/job-worker.mjs) of which one is SIGKILLed
 * every 250 ms, KILLS times, and replaced; the broker redelivers what the dead worker held (BullMQ
 * stalled jobs, RabbitMQ unacked messages, JetStream past the ack wait). Then: exactly one row per
 * job, and deduplicated deliveries (a job whose effect had committed but whose ack died with its
 * worker) were seen. Bounded by counts: KILLS kills, then at most SETTLE_POLLS polls; each test's
 * timeout (90 s) is a guard for a machine under heavy load, where one took 61 s (load average 25).
 */
const JOBS = 500;
const WORKERS = 3;
const KILLS = 5;
const ACK_DELAY_MS = 25;
const SETTLE_POLLS = 300;
const WORKER = join(import.meta.dirname, 'fixtures/job-worker.mjs');

const hasRabbitMq = await requireService('RabbitMQ', 5672);
const hasNats = await requireService('NATS', 4222);

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** Where the effects go: the worker's store and the `effect` table, in one database. */
interface EffectDatabase {
  /** The worker's argument: `sqlite:<file>` or `postgres:<schema>`. */
  target: string;
  /** Rows per job id. */
  counts(): Promise<Map<string, number>>;
  cleanup(): Promise<void>;
}

async function sqliteDatabase(): Promise<EffectDatabase> {
  const dir = mkdtempSync(join(tmpdir(), 'retrysafe-jobs-'));
  dirs.push(dir);
  const filename = join(dir, 'jobs.db');
  const store = sqliteStore({ url: filename, migrate: true });
  store.database.exec('CREATE TABLE effect (job_id TEXT NOT NULL, pid INTEGER NOT NULL)');
  await store.close();
  return {
    target: `sqlite:${filename}`,
    async counts() {
      const rows = sqliteRows<{ job_id: string; n: number }>(
        filename,
        'SELECT job_id, count(*) AS n FROM effect GROUP BY job_id',
      );
      return new Map(rows.map((row) => [row.job_id, row.n]));
    },
    cleanup: async () => undefined,
  };
}

async function postgresDatabase(): Promise<EffectDatabase> {
  const schema = uniqueName('rs_jobs');
  const store = postgresStore({ connectionString: PG_URL, schema });
  await store.migrate();
  await store.close();
  const admin = new pg.Pool({ connectionString: PG_URL, max: 1 });
  await admin.query(`CREATE TABLE "${schema}".effect (job_id text NOT NULL, pid int NOT NULL)`);
  return {
    target: `postgres:${schema}`,
    async counts() {
      const { rows } = await admin.query(
        `SELECT job_id, count(*)::int AS n FROM "${schema}".effect GROUP BY job_id`,
      );
      return new Map(rows.map((row) => [row.job_id as string, row.n as number]));
    },
    async cleanup() {
      await admin.end();
      await dropSchemas(schema);
    },
  };
}

/** Worker processes: started, SIGKILLed one at a time and replaced; counts their "dup" lines. */
class WorkerPool {
  deduplicated = 0;
  kills = 0;
  private readonly live = new Set<ChildProcess>();
  private readonly ready = new Set<ChildProcess>();
  private starting: Promise<void> = Promise.resolve();
  constructor(private readonly args: string[]) {}

  start(): Promise<void> {
    const child = spawn(process.execPath, [WORKER, ...this.args], { stdio: ['ignore', 'pipe', 'inherit'] });
    this.live.add(child);
    child.once('exit', () => {
      this.live.delete(child);
      this.ready.delete(child);
    });
    this.starting = new Promise((resolve, reject) => {
      child.once('exit', (code, signal) =>
        reject(new Error(`worker exited (${code ?? signal}) before ready`)),
      );
      createInterface({ input: child.stdout! }).on('line', (line) => {
        if (line === 'ready') {
          this.ready.add(child);
          resolve();
        } else if (line.startsWith('dup ')) this.deduplicated += 1;
      });
    });
    return this.starting;
  }

  /**
   * SIGKILLs a worker that is consuming (once the last one started is, when none is) and starts
   * its replacement, not waited for.
   */
  async killOne(): Promise<void> {
    if (this.ready.size === 0) await this.starting;
    const [victim] = this.ready;
    if (victim === undefined) throw new Error('no worker is consuming');
    this.ready.delete(victim);
    victim.kill('SIGKILL');
    this.kills += 1;
    this.start().catch(() => undefined);
  }

  async stop(signal: NodeJS.Signals): Promise<void> {
    await Promise.all(
      [...this.live].map(
        (child) =>
          new Promise<void>((resolve) => {
            child.once('exit', () => resolve());
            child.kill(signal);
          }),
      ),
    );
  }
}

/** A broker under test: its queue made, the jobs published, and when every job has been acked. */
interface Broker {
  publish(): Promise<void>;
  /** Every job acked (RabbitMQ: none left in the queue while the rows are all there). */
  settled(rows: Map<string, number>): Promise<boolean>;
  /** The job ids the rows are keyed by. */
  jobIds: string[];
  cleanup(): Promise<void>;
}

const jobIds = Array.from({ length: JOBS }, (_, i) => `job-${i + 1}`);

function bullmqBroker(queueName: string): Broker {
  const connection = { host: '127.0.0.1', port: 6379 };
  const queue = new Queue(queueName, { connection });
  return {
    jobIds,
    async publish() {
      await queue.addBulk(
        jobIds.map((jobId, i) => ({ name: 'tiny', data: { n: i + 1 }, opts: { jobId, attempts: 100 } })),
      );
    },
    async settled() {
      const counts = await queue.getJobCounts('completed');
      return counts.completed === JOBS;
    },
    async cleanup() {
      await queue.obliterate({ force: true });
      await queue.close();
    },
  };
}

async function rabbitBroker(queueName: string): Promise<Broker> {
  const connection = await amqp.connect('amqp://guest:guest@127.0.0.1:5672');
  const channel = await connection.createChannel();
  await channel.assertQueue(queueName, { durable: false });
  return {
    jobIds,
    async publish() {
      for (const [i, messageId] of jobIds.entries()) {
        channel.sendToQueue(queueName, Buffer.from(JSON.stringify({ n: i + 1 })), { messageId });
      }
      await channel.checkQueue(queueName);
    },
    async settled(rows) {
      return rows.size === JOBS && (await channel.checkQueue(queueName)).messageCount === 0;
    },
    async cleanup() {
      await channel.deleteQueue(queueName);
      await connection.close();
    },
  };
}

async function natsBroker(stream: string): Promise<Broker> {
  const nc = await natsConnect({ servers: '127.0.0.1:4222' });
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: stream, subjects: [`${stream}.jobs`] });
  // Unacked messages come back after one second.
  await jsm.consumers.add(stream, {
    durable_name: 'workers',
    ack_policy: AckPolicy.Explicit,
    ack_wait: 1_000_000_000,
    max_ack_pending: 20,
  });
  const js = jetstream(nc);
  return {
    jobIds: Array.from({ length: JOBS }, (_, i) => `${stream}:${i + 1}`),
    async publish() {
      for (let i = 0; i < JOBS; i++) {
        await js.publish(`${stream}.jobs`, JSON.stringify({ n: i + 1 }), { msgID: `job-${i + 1}` });
      }
    },
    async settled() {
      const info = await jsm.consumers.info(stream, 'workers');
      return info.num_pending === 0 && info.num_ack_pending === 0 && info.delivered.stream_seq === JOBS;
    },
    async cleanup() {
      await jsm.streams.delete(stream);
      await nc.close();
    },
  };
}

// Deduplicated deliveries per broker run. A kill lands after a job's effect and before its ack only
// by chance, so one broker may see none in a run; over the three, none at all means the
// redelivery path went untested, and the last test fails.
const deduplicated: number[] = [];

async function killWorkersWhileConsuming(
  brokerName: string,
  makeBroker: (queue: string) => Broker | Promise<Broker>,
  makeDatabase: () => Promise<EffectDatabase>,
) {
  const queue = uniqueName(`rs_${brokerName}`);
  const database = await makeDatabase();
  const broker = await makeBroker(queue);
  const pool = new WorkerPool([brokerName, queue, database.target, String(ACK_DELAY_MS)]);
  try {
    await Promise.all(Array.from({ length: WORKERS }, () => pool.start()));
    await broker.publish();
    for (let i = 0; i < KILLS; i++) {
      await sleep(250);
      await pool.killOne();
    }
    let settled = false;
    for (let poll = 0; poll < SETTLE_POLLS && !settled; poll++) {
      await sleep(100);
      settled = await broker.settled(await database.counts());
    }
    expect(settled).toBe(true);
    // RabbitMQ's workers finish and ack what they hold; the others are past caring.
    await pool.stop(brokerName === 'amqp' ? 'SIGTERM' : 'SIGKILL');
    if (brokerName === 'amqp') expect(await broker.settled(await database.counts())).toBe(true);
    const rows = await database.counts();
    expect(rows.size).toBe(JOBS);
    expect(broker.jobIds.filter((id) => rows.get(id) !== 1)).toEqual([]);
    console.log(
      `${brokerName} (${database.target.split(':')[0]}): ${JOBS} jobs, ${pool.kills} workers SIGKILLed, ` +
        `${pool.deduplicated} redeliveries deduplicated, one row per job`,
    );
    expect(pool.kills).toBe(KILLS);
    deduplicated.push(pool.deduplicated);
  } finally {
    await pool.stop('SIGKILL');
    await broker.cleanup();
    await database.cleanup();
  }
}

describe('idempotent() behind real brokers, workers SIGKILLed again and again', () => {
  it.skipIf(!hasRedis || !hasPostgres)(
    'BullMQ (stalled jobs redelivered), effects in PostgreSQL',
    async () => {
      await killWorkersWhileConsuming('bullmq', bullmqBroker, postgresDatabase);
    },
    90_000,
  );

  it.skipIf(!hasRabbitMq)(
    'RabbitMQ (unacked messages requeued), effects in SQLite',
    async () => {
      await killWorkersWhileConsuming('amqp', rabbitBroker, sqliteDatabase);
    },
    90_000,
  );

  it.skipIf(!hasNats || !hasPostgres)(
    'NATS JetStream (redelivered after the ack wait), effects in PostgreSQL',
    async () => {
      await killWorkersWhileConsuming('nats', natsBroker, postgresDatabase);
    },
    90_000,
  );

  it.skipIf(!hasRedis && !hasRabbitMq && !hasNats)(
    'deduplicated redeliveries: some across the brokers',
    () => {
      expect(deduplicated.length).toBeGreaterThan(0);
      expect(deduplicated.reduce((sum, count) => sum + count, 0)).toBeGreaterThan(0);
    },
  );
});
