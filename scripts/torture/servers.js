// The torture run's own database servers, so its schedule may restart them and kill a Redis
// Cluster master without touching the shared services (5432, 6379, 3306, 7100-7105): PostgreSQL,
// Redis and MariaDB each on a free loopback port with a temporary data directory, and a Redis
// Cluster of scripts/redis-cluster.sh on six free ports. Each starts on first use, once per
// process, and serves every store and mode of the run; `stopServers()` (or the process's exit)
// stops them and deletes their directories.
import { execFile, execFileSync, spawn } from 'node:child_process';
import { chownSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { freePort } from '../../bench/lib/proc.js';

const run = promisify(execFile);
const CLUSTER_SCRIPT = path.join(import.meta.dirname, '..', 'redis-cluster.sh');
/** How long a server may take to answer after it was started (crash recovery included). */
const READY_WITHIN_MS = 30_000;

/** Debian's PostgreSQL binaries, newest version first. */
const PG_BIN = path.join(
  '/usr/lib/postgresql',
  readdirSync('/usr/lib/postgresql', { withFileTypes: true })
    .map((entry) => entry.name)
    .sort((a, b) => Number(b) - Number(a))[0] ?? '',
  'bin',
);

/** initdb and postgres refuse to run as root: as root (CI, this machine) they run as `postgres`. */
function postgresUser() {
  if (process.getuid?.() !== 0) return {};
  const id = (flag) => Number(execFileSync('id', [flag, 'postgres'], { encoding: 'utf8' }));
  return { uid: id('-u'), gid: id('-g') };
}

/** Every server started, for `stopServers()` and the exit hook. */
const started = new Map();
process.once('exit', () => {
  for (const server of started.values()) server.exitNow();
});

/** Resolves once `probe()` succeeds; rejects after READY_WITHIN_MS or when the child exits. */
async function ready(name, probe, child, output) {
  const until = Date.now() + READY_WITHIN_MS;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`${name} exited (${child.exitCode ?? child.signalCode}):\n${output()}`);
    }
    try {
      return await probe();
    } catch (error) {
      if (Date.now() > until) throw new Error(`${name} did not answer (${error}):\n${output()}`);
      await sleep(100);
    }
  }
}

/**
 * A server child process. `restart(pauseMs)` sends `crash` (the signal of an unclean stop), waits
 * for the exit, pauses, starts it again and waits until `probe` answers.
 */
function serverProcess({ name, command, args, spawnOptions = {}, probe, crash }) {
  let child;
  let exited = Promise.resolve();
  let output = '';
  const start = async () => {
    output = '';
    child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], ...spawnOptions });
    exited = new Promise((resolve) => child.once('exit', resolve));
    child.stdout.setEncoding('utf8').on('data', (text) => (output += text));
    child.stderr.setEncoding('utf8').on('data', (text) => (output += text));
    await ready(name, probe, child, () => output);
  };
  const halt = async (signal) => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    await exited;
  };
  return {
    start,
    async restart(pauseMs) {
      await halt(crash);
      await sleep(pauseMs);
      await start();
    },
    stop: () => halt('SIGKILL'),
    exitNow: () => child?.kill('SIGKILL'),
  };
}

/**
 * A server of `kind`, made and started by `make()` on first use, then the same one (one that failed
 * to start stays failed, and is stopped with the others).
 */
function once(kind, make) {
  return () => {
    if (!started.has(kind)) started.set(kind, make());
    return started.get(kind).ready;
  };
}

/**
 * A server of `kind` on a free port with a data directory of its own: `setup(dir, port)` gives its
 * `url`, what to run once before it starts (`prepare`) and serverProcess's `command`, `args`,
 * `spawnOptions`, `probe` and `crash`. Resolves to `{ url, restart(pauseMs) }` once it answers.
 */
function privateServer(kind, setup) {
  return once(kind, () => {
    const dir = mkdtempSync(path.join(tmpdir(), `rs-torture-${kind}-`));
    let server;
    const ready = (async () => {
      const { url, prepare, ...options } = setup(dir, await freePort());
      await prepare?.();
      server = serverProcess({ name: kind, ...options });
      await server.start();
      return { url, restart: server.restart };
    })();
    const remove = () => rmSync(dir, { recursive: true, force: true });
    return {
      ready,
      stop: async () => {
        await server?.stop();
        remove();
      },
      exitNow: () => {
        server?.exitNow();
        remove();
      },
    };
  });
}

/**
 * PostgreSQL: `url` the `postgres` superuser's on database `postgres`, trust authentication. A
 * restart is `pg_ctl stop -m immediate`'s SIGQUIT: a crash followed by recovery from the WAL.
 * fsync is off: the host does not crash, the process does, and a commit's WAL is written to the
 * kernel before the commit is answered either way.
 */
export const privatePostgres = privateServer('postgres', (dir, port) => {
  const data = path.join(dir, 'data');
  const user = postgresUser();
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  return {
    url,
    async prepare() {
      if (user.uid !== undefined) chownSync(dir, user.uid, user.gid);
      await run(
        path.join(PG_BIN, 'initdb'),
        ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync'],
        user,
      );
    },
    command: path.join(PG_BIN, 'postgres'),
    args: ['-D', data, '-p', String(port), '-k', '', '-c', 'listen_addresses=127.0.0.1', '-c', 'fsync=off'],
    spawnOptions: user,
    probe: async () => {
      const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1000 });
      client.on('error', () => {});
      try {
        await client.connect();
        await client.query('SELECT 1');
      } finally {
        await client.end().catch(() => {});
      }
    },
    crash: 'SIGQUIT',
  };
});

/**
 * Redis, with the persistence docs/guarantees.md ("Redis durability") asks of keys that must
 * outlive a restart: `appendonly yes`, here with `appendfsync always`. A restart is a SIGKILL.
 */
export const privateRedis = privateServer('redis', (dir, port) => {
  const url = `redis://127.0.0.1:${port}`;
  return {
    url,
    command: 'redis-server',
    args: [
      ...['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', ''],
      ...['--appendonly', 'yes', '--appendfsync', 'always'],
    ],
    probe: async () => {
      const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
      probe.on('error', () => {});
      try {
        await probe.connect();
        // LOADING (an error) until the append-only file is read back.
        await probe.ping();
      } finally {
        probe.disconnect();
      }
    },
    crash: 'SIGKILL',
  };
});

/**
 * MariaDB: `url` root's (no password) on database `test`. A restart is a SIGKILL, then InnoDB's
 * crash recovery; `innodb_flush_log_at_trx_commit=2` writes a commit's log to the kernel before
 * answering it (what a process crash keeps), without an fsync.
 */
export const privateMariadb = privateServer('mariadb', (dir, port) => {
  const data = path.join(dir, 'data');
  const asRoot = process.getuid?.() === 0 ? ['--user=root'] : [];
  return {
    url: `mysql://root@127.0.0.1:${port}/test`,
    prepare: () =>
      run('mariadb-install-db', [
        ...['--no-defaults', `--datadir=${data}`, '--auth-root-authentication-method=normal'],
        ...['--skip-test-db', ...asRoot],
      ]),
    command: '/usr/sbin/mariadbd',
    args: [
      ...['--no-defaults', `--datadir=${data}`, `--port=${port}`, '--bind-address=127.0.0.1'],
      ...[`--socket=${path.join(dir, 'mariadb.sock')}`, `--pid-file=${path.join(dir, 'mariadb.pid')}`],
      ...['--innodb-buffer-pool-size=32M', '--innodb-flush-log-at-trx-commit=2', '--skip-log-bin'],
      ...['--max-connections=500', ...asRoot],
    ],
    probe: async () => {
      const connection = await mysql.createConnection({
        host: '127.0.0.1',
        port,
        user: 'root',
        connectTimeout: 1000,
      });
      try {
        await connection.query('CREATE DATABASE IF NOT EXISTS test');
      } finally {
        await connection.end().catch(() => {});
      }
    },
    crash: 'SIGKILL',
  };
});

/** Whether each of `ports` can be listened on now. */
async function allFree(ports) {
  for (const port of ports) {
    const free = await new Promise((resolve) => {
      const probe = net.createServer().once('error', () => resolve(false));
      probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
    });
    if (!free) return false;
  }
  return true;
}

/**
 * A Redis Cluster of scripts/redis-cluster.sh (3 masters, 3 replicas, no persistence, a 1 s node
 * timeout) on six free ports from 7200 up: `{ nodes, killMaster() }`. `killMaster()` SIGKILLs the
 * master of a random slot, waits until its replica has taken its slots over and starts the node
 * again, which rejoins as that replica's replica; it resolves once the cluster is whole again.
 */
export const privateRedisCluster = once('redis-cluster', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'rs-torture-cluster-'));
  let env;
  const script = (action) => run(CLUSTER_SCRIPT, [action], { env, timeout: 60_000 });
  const ready = (async () => {
    let base = 7200;
    // Six client ports and their cluster bus ports (+10000).
    const range = (from) => Array.from({ length: 6 }, (_, i) => from + i);
    while (!(await allFree([...range(base), ...range(base + 10_000)]))) base += 10;
    env = { ...process.env, RETRYSAFE_REDIS_CLUSTER_PORT: String(base), RETRYSAFE_REDIS_CLUSTER_DIR: dir };
    const nodes = range(base).map((port) => `127.0.0.1:${port}`);
    await script('start');
    const onNode = async (port, use) => {
      const client = new Redis({
        host: '127.0.0.1',
        port,
        maxRetriesPerRequest: 0,
        retryStrategy: () => null,
      });
      client.on('error', () => {});
      try {
        return await use(client);
      } finally {
        client.disconnect();
      }
    };
    /** The port of the node serving `slot`, as a live node other than `except` sees it. */
    const ownerOf = async (slot, except) => {
      for (const port of range(base).filter((p) => p !== except)) {
        const slots = await onNode(port, (node) => node.cluster('SLOTS')).catch(() => undefined);
        const owner = slots?.find(([from, to]) => from <= slot && slot <= to);
        if (owner) return Number(owner[2][1]);
      }
      return undefined;
    };
    return {
      nodes,
      async killMaster() {
        const slot = Math.floor(Math.random() * 16_384);
        const port = await ownerOf(slot);
        if (port === undefined) throw new Error(`no node of the cluster serves slot ${slot}`);
        const pid = await onNode(port, async (node) =>
          Number(/process_id:(\d+)/.exec(await node.info('server'))[1]),
        );
        process.kill(pid, 'SIGKILL');
        // Not started again before the replica took over: it would come back empty, still master
        // of its slots.
        const until = Date.now() + READY_WITHIN_MS;
        for (let owner = port; owner === port || owner === undefined; owner = await ownerOf(slot, port)) {
          if (Date.now() > until) throw new Error(`no replica took over slot ${slot} from ${port}`);
          await sleep(200);
        }
        await script('start');
      },
    };
  })();
  return {
    ready,
    stop: () => (env ? script('stop') : undefined),
    exitNow: () => {
      if (env) execFileSync(CLUSTER_SCRIPT, ['stop'], { env, stdio: 'ignore' });
    },
  };
});

/** Stops every server this process started and deletes their data. */
export async function stopServers() {
  const servers = [...started.values()];
  started.clear();
  for (const server of servers) {
    await server.ready.catch(() => {});
    await server.stop();
  }
}
