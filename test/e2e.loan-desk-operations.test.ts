import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { deskForBlock, getJson, postLoan, startLoanDesk } from './support/loan-desk.js';

/** The desk as an operator runs it: Prometheus metrics on /metrics, JSON logs on stdout. */

const loan = () => ({ member: 'U-1001', isbn: 'K-01', issuedAt: '2026-03-10' });

/** The value of one sample of the Prometheus text, or undefined when the series is absent. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/** The JSON lines of a desk's output (the other lines are the desk's start messages). */
function logLines(output: string): Record<string, any>[] {
  return output
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line));
}

function deadPort(): Promise<number> {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

describe('loan desk /metrics', () => {
  const desk = deskForBlock({ env: { IDEMPOTENCY_MODE: 'lease' } });

  it('counts a replay, the execution before it and their store time, beside the process metrics', async () => {
    const key = randomUUID();
    expect((await postLoan(desk().baseUrl, loan(), { key })).status).toBe(201);
    const replay = await postLoan(desk().baseUrl, loan(), { key });
    expect(replay.headers.get('idempotency-replayed')).toBe('true');
    expect((await postLoan(desk().baseUrl, { ...loan(), isbn: 'K-02' }, { key })).status).toBe(409);

    const metrics = await fetch(`${desk().baseUrl}/metrics`);
    expect(metrics.status).toBe(200);
    expect(metrics.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await metrics.text();
    expect(sample(text, 'retrysafe_outcomes_total{outcome="executed",reason=""}')).toBe(1);
    expect(sample(text, 'retrysafe_outcomes_total{outcome="replayed",reason=""}')).toBe(1);
    expect(sample(text, 'retrysafe_outcomes_total{outcome="conflict",reason=""}')).toBe(1);
    expect(sample(text, 'retrysafe_store_duration_seconds_count{outcome="replayed"}')).toBe(1);
    expect(sample(text, 'retrysafe_handler_duration_seconds_count{outcome="executed"}')).toBe(1);
    expect(sample(text, 'retrysafe_keys_purged_total')).toBe(0);
    expect(sample(text, 'process_cpu_user_seconds_total')).toBeGreaterThan(0);
    expect(text).toContain('nodejs_eventloop_lag_seconds');
    expect((await getJson(desk().baseUrl, '/metrics')).status).toBe(200);
  });

  it('counts the keys the purge deletes', async () => {
    const short = await startLoanDesk({ env: { IDEMPOTENCY_TTL: '1s', PURGE_INTERVAL: '200ms' } });
    try {
      for (let i = 0; i < 3; i++)
        expect((await postLoan(short.baseUrl, loan(), { key: randomUUID() })).status).toBe(201);
      // Three keys, the loans': the outbox sends their receipts without one.
      let purged: number | undefined;
      for (let attempt = 0; attempt < 50 && purged !== 3; attempt++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        purged = sample(
          await (await fetch(`${short.baseUrl}/metrics`)).text(),
          'retrysafe_keys_purged_total',
        );
      }
      expect(purged).toBe(3);
    } finally {
      await short.stop();
    }
  }, 20_000);
});

describe('loan desk /metrics with WORKERS=2', () => {
  it('every scrape counts the requests of both workers, and keeps process metrics per worker', async () => {
    const desk = await startLoanDesk({ workers: 2, env: { LOG_LEVEL: 'debug' } });
    // A new connection per request: the cluster primary deals connections to the workers in turn.
    const fresh = { connection: 'close' };
    const keys: string[] = [];
    const scrapes: string[] = [];
    let output: string;
    const executedBy = (output: string) =>
      new Set(
        logLines(output)
          .filter((line) => line.type === 'executed')
          .map((line) => line.pid),
      );
    try {
      // At least 8 loans, and on until both workers have made one (their log lines say which):
      // which worker a connection goes to is the cluster's choice, and a fetch may keep one open.
      while (keys.length < 8 || (executedBy(desk.output()).size < 2 && keys.length < 60)) {
        const key = randomUUID();
        keys.push(key);
        expect((await postLoan(desk.baseUrl, loan(), { key, headers: fresh })).status).toBe(201);
        if (keys.length >= 8) await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const replay = await postLoan(desk.baseUrl, loan(), { key: keys[0], headers: fresh });
      expect(replay.headers.get('idempotency-replayed')).toBe('true');
      for (let i = 0; i < 6; i++) {
        const metrics = await fetch(`${desk.baseUrl}/metrics`, { headers: fresh });
        expect(metrics.status).toBe(200);
        scrapes.push(await metrics.text());
      }
    } finally {
      expect(await desk.stop()).toBe(0);
      output = desk.output();
    }
    expect(executedBy(output).size).toBe(2);
    for (const text of scrapes) {
      expect(sample(text, 'retrysafe_outcomes_total{outcome="executed",reason=""}')).toBe(keys.length);
      expect(sample(text, 'retrysafe_outcomes_total{outcome="replayed",reason=""}')).toBe(1);
      expect(sample(text, 'retrysafe_handler_duration_seconds_count{outcome="executed"}')).toBe(keys.length);
      expect(sample(text, 'retrysafe_keys_purged_total')).toBe(0);
      // A sum of heaps or event-loop lags describes no process: each worker's stay apart.
      for (const worker of ['1', '2']) {
        expect(sample(text, `process_resident_memory_bytes{worker="${worker}"}`)).toBeGreaterThan(0);
        expect(sample(text, `nodejs_heap_size_used_bytes{worker="${worker}"}`)).toBeGreaterThan(0);
      }
      expect(text).not.toContain('process_start_time_seconds');
    }
  }, 30_000);
});

describe('loan desk logs', () => {
  it('a key-store outage logs its cause, ten lines a minute, then how many it left out', async () => {
    const desk = await startLoanDesk({ env: { IDEMPOTENCY_STORE: `redis://127.0.0.1:${await deadPort()}` } });
    let output: string;
    try {
      const answers = await Promise.all(
        Array.from({ length: 30 }, () => postLoan(desk.baseUrl, loan(), { key: randomUUID() })),
      );
      expect(answers.map((a) => a.status)).toEqual(Array(30).fill(503));
    } finally {
      await desk.stop();
      output = desk.output();
    }
    const lines = logLines(output).filter((line) => line.event === 'store_error');
    const errors = lines.filter((line) => line.err);
    expect(errors).toHaveLength(10);
    for (const line of errors) {
      expect(line).toMatchObject({ level: 50, operation: 'claim' });
      expect(typeof line.key).toBe('string');
      expect(line.msg).toMatch(/^idempotency store claim failed: ./);
      expect(line.err.message.length).toBeGreaterThan(0);
    }
    expect(lines.filter((line) => line.suppressed)).toEqual([
      expect.objectContaining({ suppressed: 20, msg: expect.stringContaining('20 more') }),
    ]);
  }, 30_000);

  it('LOG_LEVEL=debug writes a line per idempotency event; an unknown level stops the start', async () => {
    const desk = await startLoanDesk({ env: { LOG_LEVEL: 'debug', IDEMPOTENCY_MODE: 'lease' } });
    let output: string;
    try {
      const key = randomUUID();
      await postLoan(desk.baseUrl, loan(), { key });
      await postLoan(desk.baseUrl, loan(), { key });
    } finally {
      await desk.stop();
      output = desk.output();
    }
    const events = logLines(output).filter((line) => line.level === 20);
    expect(events.map((line) => line.type)).toEqual(['executed', 'replayed']);
    await expect(startLoanDesk({ env: { LOG_LEVEL: 'loud' } })).rejects.toThrow(
      /LOG_LEVEL="loud" is invalid/,
    );
  }, 30_000);
});
