import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, it } from 'vitest';
import { startApp } from './support/child-app.js';

// Issue 33 item 2: the SQLite driver's group commit answers no member before the group's COMMIT.
// The app SIGKILLs itself just before the COMMIT of a group of three handlers or more: no client
// may hold a 201 for an order that is not in the file afterwards, and every key, retried on a
// restarted app, ends with exactly one order.

const APP = join(import.meta.dirname, 'fixtures', 'group-commit-app.mjs');
const GROUP = 3;
const dir = mkdtempSync(join(tmpdir(), 'retrysafe-group-commit-'));
const children: ChildProcess[] = [];
afterAll(() => {
  for (const child of children) child.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

async function start(storeFile: string, ranFile: string, killAt: number) {
  const { exited, port } = await startApp(APP, [storeFile, ranFile, String(killAt)], children);
  return { exited, url: `http://127.0.0.1:${port}/orders` };
}

const order = (url: string, key: string) =>
  fetch(url, { method: 'POST', headers: { 'idempotency-key': key }, body: '{}' }).then(
    async (response) => ({ status: response.status, replayed: response.headers.get('idempotency-replayed') }),
    () => ({ status: 0, replayed: null }),
  );

describe('SQLite group commit: SIGKILL before a group commits', () => {
  it('no answer is sent before its commit: every 201 is in the file, every key ends with one order', async () => {
    const storeFile = join(dir, 'store.db');
    const ranFile = join(dir, 'ran.log');
    const app = await start(storeFile, ranFile, GROUP);
    const answered = new Map<string, number>();
    let died = false;
    app.exited.then(() => (died = true));
    // Waves of 30 concurrent orders until a group of three or more meets its COMMIT.
    for (let wave = 0; wave < 100 && !died; wave++) {
      const keys = Array.from({ length: 30 }, () => randomUUID());
      const results = await Promise.all(keys.map((key) => order(app.url, key)));
      for (const [i, key] of keys.entries()) answered.set(key, results[i]!.status);
    }
    expect(await app.exited).toBe('SIGKILL');

    const db = new Database(storeFile, { readonly: true });
    const committed = new Set(
      (db.prepare('SELECT key FROM orders').all() as { key: string }[]).map((row) => row.key),
    );
    db.close();
    const ran = readFileSync(ranFile, 'utf8').trim().split('\n');
    const lost = ran.filter((key) => !committed.has(key));
    // The killed group: its handlers ran, their writes were never committed, and none was answered.
    expect(lost.length).toBeGreaterThanOrEqual(GROUP);
    const answeredCreated = [...answered].filter(([, status]) => status === 201).map(([key]) => key);
    expect(answeredCreated.filter((key) => !committed.has(key))).toEqual([]);
    expect(lost.filter((key) => answered.get(key) === 201)).toEqual([]);

    // A restarted app: each key retried gets its 201 (a replay where it committed) and one order.
    const again = await start(storeFile, ranFile, 0);
    const keys = [...answered.keys()];
    const retried = await Promise.all(keys.map((key) => order(again.url, key)));
    expect(retried.filter((result) => result.status !== 201)).toEqual([]);
    for (const [i, key] of keys.entries()) {
      expect(retried[i]!.replayed === 'true').toBe(committed.has(key));
    }
    const after = new Database(storeFile, { readonly: true });
    const counts = after.prepare('SELECT key, count(*) AS n FROM orders GROUP BY key HAVING n <> 1').all();
    after.close();
    expect(counts).toEqual([]);
  });
});
