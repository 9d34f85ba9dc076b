import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { startApp } from './support/child-app.js';

// Issue 34 item 3: an Express or Fastify app SIGKILLed after a payment's charge was saved; a second
// process, the same app with a completer through it (`resumeThrough`), finishes the payment.

const APP = join(import.meta.dirname, 'fixtures', 'resume-app.mjs');
const dir = mkdtempSync(join(tmpdir(), 'retrysafe-resume-through-'));
const children: ChildProcess[] = [];
afterAll(() => {
  for (const child of children) child.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

async function start(args: string[]) {
  const { child, exited, port } = await startApp(APP, args, children);
  return { child, exited, url: `http://127.0.0.1:${port}/pay` };
}

const pay = (url: string, key: string) =>
  fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: '{"amount":40}',
  });

describe.each(['express', 'fastify'])('%s: SIGKILL after a step', (framework) => {
  it("a completer in another process finishes the payment through the app: one charge, the client's retry replays", async () => {
    const key = randomUUID();
    const storeFile = join(dir, `store-${framework}.db`);
    const providerFile = join(dir, `provider-${framework}.db`);
    const crashing = await start([framework, storeFile, providerFile, 'after-charged', '0']);
    const lost = await pay(crashing.url, key).catch((error: unknown) => error);
    expect(lost).toBeInstanceOf(Error);
    expect(await crashing.exited).toBe('SIGKILL');

    const finishing = await start([framework, storeFile, providerFile, 'none', '1']);
    const provider = new Database(providerFile, { readonly: true, timeout: 5000 });
    const receipts = () =>
      provider.prepare('SELECT pid FROM receipt WHERE key = ?').all(key) as { pid: number }[];
    // The lease (300 ms) passes, then a completer pass (every 50 ms) takes the operation over.
    for (let tries = 0; tries < 400 && receipts().length === 0; tries++) await sleep(25);
    expect(receipts()).toEqual([{ pid: finishing.child.pid }]);

    const late = await pay(finishing.url, key);
    expect(late.status).toBe(201);
    expect(late.headers.get('idempotency-replayed')).toBe('true');
    expect(await late.json()).toEqual({ charge: 'ch_1', amount: 40 });
    expect(provider.prepare('SELECT count(*) AS n FROM charge WHERE key = ?').get(key)).toEqual({ n: 1 });
    provider.close();
    finishing.child.kill('SIGKILL');
  });
});
