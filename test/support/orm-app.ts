import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from './free-port.js';
import { PG_URL, uniqueName } from './services.js';

// The ORM quick starts' contract (examples/orm/<orm>/app.js), checked over HTTP against the app
// run as a child process: `node examples/orm/<orm>/app.js` with DATABASE_URL and PORT.

const root = join(import.meta.dirname, '../..');

/** A database of its own on the test server, for one app's tables; `drop()` removes it. */
export async function freshDatabase(prefix = 'rs_orm'): Promise<{ url: string; drop(): Promise<void> }> {
  const name = uniqueName(prefix);
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE DATABASE "${name}"`);
  await admin.end();
  const url = new URL(PG_URL);
  url.pathname = `/${name}`;
  return {
    url: url.href,
    async drop() {
      const client = new pg.Client({ connectionString: PG_URL });
      await client.connect();
      try {
        await client.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
      } finally {
        await client.end();
      }
    },
  };
}

export interface OrmApp {
  url: string;
  /** Asks the app to stop (SIGTERM) and waits for it to exit. */
  stop(): Promise<void>;
  /** SIGKILL: the process dies at once, mid-request or not, and its connections drop. */
  kill(): Promise<void>;
}

/** Starts `examples/orm/<orm>/app.js` on a free port and resolves once it listens. */
export async function startOrmApp(orm: string, databaseUrl: string, timeoutMs = 60_000): Promise<OrmApp> {
  const port = await freePort();
  const child: ChildProcess = spawn(process.execPath, [join(root, 'examples/orm', orm, 'app.js')], {
    cwd: root,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), HOST: '127.0.0.1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const exited = once(child, 'exit');
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${orm} app did not listen in time:\n${output}`)),
      timeoutMs,
    );
    const read = (chunk: Buffer) => {
      output += chunk;
      if (/listening on/.test(output)) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout!.on('data', read);
    child.stderr!.on('data', (chunk: Buffer) => (output += chunk));
    exited.then(([code]) => {
      clearTimeout(timer);
      reject(new Error(`${orm} app exited (${code}) before listening:\n${output}`));
    });
  });
  const end = async (signal: NodeJS.Signals) => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    await exited;
  };
  return { url: `http://127.0.0.1:${port}`, stop: () => end('SIGTERM'), kill: () => end('SIGKILL') };
}

/** `POST /orders {item}`, with `key` as the Idempotency-Key when given. */
export async function postOrder(app: OrmApp, item: string, key?: string) {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (key !== undefined) headers['idempotency-key'] = key;
  const response = await fetch(`${app.url}/orders`, {
    method: 'POST',
    headers,
    body: JSON.stringify({ item }),
  });
  const text = await response.text();
  let body: any;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  return { status: response.status, body, replayed: response.headers.get('idempotency-replayed') };
}

/** `GET /orders`: every order the app has kept. */
export async function listOrders(app: OrmApp): Promise<{ id: number; item: string }[]> {
  const response = await fetch(`${app.url}/orders`);
  if (response.status !== 200) throw new Error(`GET /orders answered ${response.status}`);
  return (await response.json()) as { id: number; item: string }[];
}

/** Resolves once a backend of `databaseUrl`'s database sits in an open transaction after an INSERT. */
async function insertInOpenTransaction(databaseUrl: string, deadlineMs = 30_000): Promise<void> {
  const client = new pg.Client({ connectionString: PG_URL });
  await client.connect();
  try {
    const database = new URL(databaseUrl).pathname.slice(1);
    for (const deadline = Date.now() + deadlineMs; Date.now() < deadline; ) {
      const { rows } = await client.query(
        `SELECT 1 FROM pg_stat_activity WHERE datname = $1 AND state = 'idle in transaction' AND query ILIKE 'insert%'`,
        [database],
      );
      if (rows.length > 0) return;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    throw new Error('no transaction with an INSERT opened in time');
  } finally {
    await client.end();
  }
}

/**
 * Issue 31's HTTP scenarios against `examples/orm/<orm>/app.js`, on a database of its own: one
 * describe block per ORM, so every quick start is held to the same promises.
 */
export function describeOrmQuickStart(orm: string): void {
  describe(`${orm} quick start (examples/orm/${orm}/app.js)`, () => {
    let database: Awaited<ReturnType<typeof freshDatabase>>;
    let app: OrmApp;
    let n = 0;
    const key = () => `${orm}-${process.pid}-${++n}`;
    const rowsOf = async (item: string) => (await listOrders(app)).filter((order) => order.item === item);

    beforeAll(async () => {
      database = await freshDatabase(`rs_orm_${orm}`);
      app = await startOrmApp(orm, database.url);
    }, 120_000);

    afterAll(async () => {
      await app?.stop();
      await database?.drop();
    });

    it('POST /orders makes an order, keyed or not; GET /orders lists them all', async () => {
      const plain = await postOrder(app, 'book');
      expect(plain.status).toBe(201);
      expect(plain.body).toEqual({ id: expect.any(Number), item: 'book' });
      const keyed = await postOrder(app, 'pen', key());
      expect(keyed.status).toBe(201);
      expect(await listOrders(app)).toEqual(expect.arrayContaining([plain.body, keyed.body]));
    });

    it('200 concurrent duplicates of one key make one row and one answer', async () => {
      const k = key();
      const answers = await Promise.all(Array.from({ length: 200 }, () => postOrder(app, 'duplicate', k)));
      const made = answers.filter((answer) => answer.status === 201);
      expect(made.length).toBeGreaterThan(0);
      expect(new Set(made.map((answer) => JSON.stringify(answer.body))).size).toBe(1);
      for (const answer of answers.filter((a) => a.status !== 201)) {
        expect(answer).toMatchObject({ status: 409, body: { error: 'request_in_progress' } });
      }
      expect(await rowsOf('duplicate')).toEqual([made[0]!.body]);
    });

    it('fail-after-write keeps nothing and leaves the key free: the retry runs again', async () => {
      const k = key();
      const first = await postOrder(app, 'fail-after-write', k);
      expect(first.status).toBe(500);
      const retry = await postOrder(app, 'fail-after-write', k);
      expect(retry.status).toBe(500);
      expect(retry.replayed).toBeNull();
      expect(await rowsOf('fail-after-write')).toEqual([]);
    });

    it('the same key with another item is refused (409) and writes nothing', async () => {
      const k = key();
      expect((await postOrder(app, 'first-item', k)).status).toBe(201);
      const other = await postOrder(app, 'second-item', k);
      expect(other).toMatchObject({ status: 409, body: { error: 'key_conflict' } });
      expect(await rowsOf('second-item')).toEqual([]);
    });

    it('SIGKILL during "slow" keeps no row; after a restart the retry runs once', async () => {
      const k = key();
      const lost = postOrder(app, 'slow', k).catch((error: unknown) => error);
      await insertInOpenTransaction(database.url);
      await app.kill();
      expect(await lost).toBeInstanceOf(Error);
      app = await startOrmApp(orm, database.url);
      expect(await rowsOf('slow')).toEqual([]);
      const retry = await postOrder(app, 'slow', k);
      expect(retry.status).toBe(201);
      const again = await postOrder(app, 'slow', k);
      expect(again).toMatchObject({ status: 201, body: retry.body, replayed: 'true' });
      expect(await rowsOf('slow')).toEqual([retry.body]);
    }, 60_000);
  });
}
