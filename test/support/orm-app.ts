import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { freePort } from './free-port.js';
import { PG_URL, uniqueName } from './services.js';

/**
 * The ORM quick starts of issue 31, run as a user runs them: `node examples/orm/<orm>/app.js`
 * with `DATABASE_URL` and `PORT`, serving `POST /orders {item}` and `GET /orders`.
 */

const ROOT = path.resolve(import.meta.dirname, '../..');

/** Every ORM with a quick start promised; the tests run those whose app exists. */
export const ORMS = ['drizzle', 'kysely', 'knex', 'typeorm', 'prisma', 'sequelize', 'mikro-orm'] as const;
export type Orm = (typeof ORMS)[number];

export const ormAppPath = (orm: Orm): string => path.join(ROOT, 'examples/orm', orm, 'app.js');

/** The ORMs whose `examples/orm/<orm>/app.js` is in this checkout. */
export const ormsWithApps: Orm[] = ORMS.filter((orm) => existsSync(ormAppPath(orm)));

const live = new Set<ChildProcess>();

// A failed test must not leave apps listening.
process.once('exit', () => {
  for (const child of live) killGroup(child, 'SIGKILL');
});

function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  try {
    process.kill(-child.pid!, signal);
  } catch {
    // Already gone.
  }
}

async function withAdmin<T>(use: (admin: pg.Client) => Promise<T>): Promise<T> {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  try {
    return await use(admin);
  } finally {
    await admin.end();
  }
}

export interface AppDatabase {
  name: string;
  /** `postgres://…/<name>`, for the app's `DATABASE_URL`. */
  url: string;
  /**
   * The statements of the app's connections that sit inside an open transaction, waiting for the
   * app (`idle in transaction`): what a handler that is still running last sent.
   */
  openTransactions(): Promise<string[]>;
  /** How many connections to this database there are, from anyone. */
  connections(): Promise<number>;
  /** Drops the database, ending any connection left to it. */
  drop(): Promise<void>;
}

/** A new, empty PostgreSQL database on the test server, for one app. */
export async function freshDatabase(): Promise<AppDatabase> {
  const name = uniqueName('rs_orm');
  await withAdmin((admin) => admin.query(`CREATE DATABASE "${name}"`));
  const url = new URL(PG_URL);
  url.pathname = `/${name}`;
  return {
    name,
    url: url.toString(),
    async openTransactions() {
      return withAdmin(async (admin) => {
        const { rows } = await admin.query(
          `SELECT query FROM pg_stat_activity WHERE datname = $1 AND state = 'idle in transaction'`,
          [name],
        );
        return rows.map((row: { query: string }) => row.query);
      });
    },
    async connections() {
      return withAdmin(async (admin) => {
        const { rows } = await admin.query(
          'SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
          [name],
        );
        return rows[0].n as number;
      });
    },
    async drop() {
      await withAdmin((admin) => admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`));
    },
  };
}

export interface AppResponse {
  status: number;
  headers: Headers;
  /** The JSON body parsed, or the text when it is not JSON. */
  body: any;
}

export interface OrmApp {
  orm: Orm;
  baseUrl: string;
  /** Everything the app printed so far, stdout and stderr interleaved. */
  output(): string;
  /** `POST /orders {item}`, under `key` when given. */
  order(item: string, key?: string): Promise<AppResponse>;
  /** `GET /orders`: every order the app's table holds. */
  orders(): Promise<{ id: unknown; item: string }[]>;
  /** SIGTERM, then SIGKILL if it has not exited within 15 s. */
  stop(): Promise<void>;
  /** SIGKILL to the app's process group, like a power cut; resolves once it has exited. */
  kill9(): Promise<void>;
}

async function read(response: Response): Promise<AppResponse> {
  const text = await response.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // Not JSON: keep the text.
  }
  return { status: response.status, headers: response.headers, body };
}

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once('exit', () => resolve()));
}

/**
 * Starts `examples/orm/<orm>/app.js` on a free port with `databaseUrl`, in its own process group,
 * and resolves once `GET /orders` answers 200. Needs dist/ (the app imports `retrysafe/*`).
 */
export async function startOrmApp(orm: Orm, databaseUrl: string, startTimeoutMs = 90_000): Promise<OrmApp> {
  const port = await freePort();
  const child = spawn(process.execPath, [ormAppPath(orm)], {
    cwd: ROOT,
    env: { ...process.env, DATABASE_URL: databaseUrl, PORT: String(port) },
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  live.add(child);
  child.once('exit', () => live.delete(child));
  let output = '';
  child.stdout!.setEncoding('utf8').on('data', (text: string) => (output += text));
  child.stderr!.setEncoding('utf8').on('data', (text: string) => (output += text));

  const baseUrl = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + startTimeoutMs;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(
        `${orm} app exited (${child.signalCode ?? child.exitCode}) before answering:\n${output}`,
      );
    }
    try {
      const response = await fetch(`${baseUrl}/orders`, { signal: AbortSignal.timeout(5_000) });
      await response.arrayBuffer();
      if (response.status === 200) break;
    } catch {
      // Not listening yet.
    }
    if (Date.now() > deadline) {
      killGroup(child, 'SIGKILL');
      throw new Error(`${orm} app did not answer GET /orders within ${startTimeoutMs} ms:\n${output}`);
    }
    await sleep(100);
  }

  return {
    orm,
    baseUrl,
    output: () => output,
    async order(item, key) {
      const response = await fetch(`${baseUrl}/orders`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          ...(key === undefined ? {} : { 'idempotency-key': key }),
        },
        body: JSON.stringify({ item }),
        signal: AbortSignal.timeout(60_000),
      });
      return read(response);
    },
    async orders() {
      const { status, body } = await read(
        await fetch(`${baseUrl}/orders`, { signal: AbortSignal.timeout(30_000) }),
      );
      if (status !== 200 || !Array.isArray(body)) {
        throw new Error(`GET /orders answered ${status}: ${JSON.stringify(body)}`);
      }
      return body;
    },
    async stop() {
      const done = exited(child);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => killGroup(child, 'SIGKILL'), 15_000);
      await done;
      clearTimeout(timer);
    },
    async kill9() {
      const done = exited(child);
      killGroup(child, 'SIGKILL');
      await done;
    },
  };
}

/** Polls `check` every 20 ms until it answers true; throws `what` after `timeoutMs`. */
export async function waitFor(
  what: string,
  check: () => Promise<boolean>,
  timeoutMs = 30_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}
