import { type ChildProcess, spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { freePort } from './free-port.js';
import { PG_URL } from './services.js';

/** Debian's pgbouncer (`apt-get install pgbouncer`; `.ci/run` installs it). */
const PGBOUNCER = '/usr/sbin/pgbouncer';

function pgbouncerInstalled(): boolean {
  if (existsSync(PGBOUNCER)) return true;
  const message = `${PGBOUNCER} is missing (apt-get install pgbouncer)`;
  if (process.env.CI === 'true') throw new Error(`${message}; CI=true makes the PgBouncer tests mandatory`);
  console.warn(`\n!!!!!!!! SKIPPING PgBouncer TESTS: ${message} !!!!!!!!\n`);
  return false;
}

/** Whether the PgBouncer tests can run: pgbouncer installed (PostgreSQL is checked by services.ts). */
export const hasPgBouncer = pgbouncerInstalled();

export interface PgBouncer {
  /** `PG_URL` with host and port of this pgbouncer instead of PostgreSQL's. */
  url: string;
  port: number;
  /** Everything it logged so far. */
  output(): string;
  /** SIGINT (immediate shutdown), then waits for it to exit; removes its config. */
  stop(): Promise<void>;
}

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

/**
 * Starts a pgbouncer of its own on a free loopback port, in front of the machine's PostgreSQL
 * (`PG_URL`'s host and port), in transaction pooling mode with `poolSize` server connections per
 * database and user, trust authentication for the users listed. Resolves once it accepts a query.
 */
export async function startPgBouncer(
  options: { poolSize?: number; users?: string[] } = {},
): Promise<PgBouncer> {
  const target = new URL(PG_URL);
  const dir = mkdtempSync(path.join(tmpdir(), 'pgbouncer-'));
  // pgbouncer refuses to run as root: as root (CI, this machine) it switches to the postgres user,
  // who must read its config.
  chmodSync(dir, 0o755);
  const port = await freePort();
  const users = options.users ?? [decodeURIComponent(target.username) || 'postgres'];
  writeFileSync(path.join(dir, 'users.txt'), users.map((user) => `"${user}" ""\n`).join(''));
  writeFileSync(
    path.join(dir, 'pgbouncer.ini'),
    `[databases]
* = host=${target.hostname} port=${target.port || 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = trust
auth_file = ${path.join(dir, 'users.txt')}
pool_mode = transaction
default_pool_size = ${options.poolSize ?? 10}
max_client_conn = 2000
server_login_retry = 1
`,
  );
  const asRoot = process.getuid?.() === 0;
  const child = spawn(PGBOUNCER, [...(asRoot ? ['-u', 'postgres'] : []), path.join(dir, 'pgbouncer.ini')], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  live.add(child);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  exited.then(() => live.delete(child));
  let output = '';
  child.stdout!.setEncoding('utf8').on('data', (text: string) => (output += text));
  child.stderr!.setEncoding('utf8').on('data', (text: string) => (output += text));

  const url = new URL(PG_URL);
  url.hostname = '127.0.0.1';
  url.port = String(port);
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGINT');
    await exited;
    rmSync(dir, { recursive: true, force: true });
  };
  for (let attempt = 0; ; attempt++) {
    const client = new pg.Client({ connectionString: url.toString(), connectionTimeoutMillis: 1000 });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.query('SELECT 1');
      await client.end();
      break;
    } catch (error) {
      await client.end().catch(() => {});
      if (attempt === 50 || child.exitCode !== null) {
        await stop();
        throw new Error(`pgbouncer did not start (${String(error)}); it logged:\n${output}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  return { url: url.toString(), port, output: () => output, stop };
}
