// @ts-check
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';

/** Debian's pgbouncer (`apt-get install pgbouncer`; `.ci/run` installs it). */
export const PGBOUNCER = '/usr/sbin/pgbouncer';

/**
 * @typedef {object} PgBouncer
 * @property {string} url `target`'s URL with host and port of this pgbouncer instead of PostgreSQL's
 * @property {number} port
 * @property {() => string} output everything it logged so far
 * @property {() => Promise<void>} stop SIGINT (immediate shutdown), then waits for it to exit; removes its config
 */

/** @type {Set<import('node:child_process').ChildProcess>} */
const live = new Set();
process.once('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

/**
 * Starts a pgbouncer of its own on a free loopback port, in front of the PostgreSQL `target` (a
 * `postgres://` URL) names, in transaction pooling mode with `poolSize` server connections per
 * database and user, trust authentication for the users listed, listening on `port` (a free one).
 * Resolves once it accepts a query.
 *
 * @param {string} target
 * @param {{ port: number, poolSize?: number, users?: string[] }} options
 * @returns {Promise<PgBouncer>}
 */
export async function startPgBouncer(target, options) {
  const targetUrl = new URL(target);
  const dir = mkdtempSync(path.join(tmpdir(), 'pgbouncer-'));
  // pgbouncer refuses to run as root: as root (CI, this machine) it switches to the postgres user,
  // who must read its config.
  chmodSync(dir, 0o755);
  const { port } = options;
  const users = options.users ?? [decodeURIComponent(targetUrl.username) || 'postgres'];
  writeFileSync(path.join(dir, 'users.txt'), users.map((user) => `"${user}" ""\n`).join(''));
  writeFileSync(
    path.join(dir, 'pgbouncer.ini'),
    `[databases]
* = host=${targetUrl.hostname} port=${targetUrl.port || 5432}

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
  const exited = new Promise((resolve) => child.once('exit', () => resolve(undefined)));
  exited.then(() => live.delete(child));
  let output = '';
  /** @type {import('node:stream').Readable} */ (child.stdout)
    .setEncoding('utf8')
    .on('data', (/** @type {string} */ text) => (output += text));
  /** @type {import('node:stream').Readable} */ (child.stderr)
    .setEncoding('utf8')
    .on('data', (/** @type {string} */ text) => (output += text));

  const url = new URL(target);
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
