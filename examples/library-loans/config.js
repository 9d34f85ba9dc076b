import ms from 'ms';
import { parseDuration } from 'retrysafe';

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

/**
 * The loan desk's settings, read from the environment once at start. Every mistake is reported
 * with the variable's name, before anything is opened.
 *
 * HOST, PORT                 where to listen (127.0.0.1:8483; PORT=0 picks a free port)
 * DATABASE_URL               a SQLite file (library.db), postgres://user@host:port/db?schema=name
 *                            (&pooling=transaction behind PgBouncer in transaction pooling mode)
 *                            or mysql://user@host:port/db (MySQL or MariaDB)
 * IDEMPOTENCY_STORE          where keys live: the database (default), `memory`, or
 *                            redis://host:port?prefix=name (keys then live in Redis, loans in SQL),
 *                            or redis+cluster://host:port,host:port?prefix=name (a Redis Cluster)
 * IDEMPOTENCY_MODE           atomic (default with keys in the database) or lease
 * IDEMPOTENCY_REQUIRED       true: POST /loans without a key is 400 (default false: a new loan each time)
 * IDEMPOTENCY_TTL            how long a key replays its response (24h; e.g. 7d, 2s)
 * IDEMPOTENCY_LEASE          how long a claim lasts unless its running handler renews it (10s)
 * IDEMPOTENCY_WAIT           how long a duplicate waits for an in-progress original before 409 (10s)
 * IDEMPOTENCY_ENCRYPTION_KEY base64 32-byte keys, comma-separated, current first: stored answers are
 *                            encrypted with the first and read with any (none: stored in clear)
 * PURGE_INTERVAL             how often expired keys are deleted (1m)
 * PROVIDER_URL               the payment provider fines are charged at (http://127.0.0.1:8484)
 * COMPLETER                  1 (default): finish fines whose client never came back, once their
 *                            lease passed; 0: only a retry finishes them
 * COMPLETER_INTERVAL         how often the completer looks for them (5s)
 * WORKERS                    processes sharing the port and the database (1)
 * REDIS_URL                  redis://host:port?prefix=name: each loan's receipt goes through a BullMQ
 *                            queue there (default: the IDEMPOTENCY_STORE Redis if one; else, or with
 *                            REDIS_URL=none, a worker in each desk process sends it from the outbox)
 * RECEIPTS                   1 (default): this process sends the receipts of new loans; 0: it sends
 *                            none, their jobs wait in the outbox for a process that does
 * RECEIPT_DELAY_MS           for tests only: a pause before each batch of receipts is written,
 *                            after its jobs were claimed, so a SIGKILL lands mid-job (0;
 *                            faults/test-hooks.js)
 * SCOPE_SECRET               at least 16 characters keying the scope digests (HMAC-SHA-256 of
 *                            Authorization); unset, the desk makes one once and keeps it in its database
 * ADMIN_TOKEN                the bearer token /admin/keys and /metrics require
 * ADMIN_LOOPBACK             1: /admin/keys also answers direct loopback callers without the token
 *                            (never a request with X-Forwarded-For, Forwarded or Via); 0 (default).
 *                            Neither set: the admin API is closed
 * DEMO_FAULTS                1 (on a loopback HOST only): the page's lossy-network switch works (a
 *                            fault proxy in front of the desk loses the answers it marks;
 *                            faults/fault-front.js), and POST /fines with `Demo-Crash-After:
 *                            recorded|charged|paid` kills the desk (SIGKILL) right after that step
 *                            is saved; 0 (default): both are ignored
 * LOG_LEVEL                  JSON log lines on stdout at this level and above: fatal, error, warn,
 *                            info (default), debug (one line per idempotency event), trace, silent
 */
export function readConfig(env = process.env) {
  const fail = (name, expected) => {
    throw new Error(`${name}=${JSON.stringify(env[name])} is invalid: expected ${expected}`);
  };
  const duration = (name, fallback, min = 1) => {
    try {
      return parseDuration(env[name] || fallback, { name, min });
    } catch {
      return fail(name, 'a duration like 2s, 1m, 24h, 7d');
    }
  };
  const integer = (name, fallback, min) => {
    const value = env[name] || String(fallback);
    const parsed = Number(value);
    if (!/^\d+$/.test(value) || !Number.isSafeInteger(parsed) || parsed < min) {
      fail(name, `an integer of at least ${min}`);
    }
    return parsed;
  };

  const port = integer('PORT', 8483, 0);
  if (port > 65535) fail('PORT', 'a port number up to 65535');

  const databaseUrl = env.DATABASE_URL || 'library.db';
  let database;
  const scheme = /^([a-z][a-z\d+.-]*):\/\//i.exec(databaseUrl)?.[1];
  if (scheme && !/^(postgres(ql)?|mysql|sqlite|file)$/i.test(scheme)) {
    fail('DATABASE_URL', `postgres://, postgresql://, mysql:// or a SQLite file, not a ${scheme}:// URL`);
  }
  if (/^mysql:\/\//i.test(databaseUrl)) {
    let url;
    try {
      url = new URL(databaseUrl);
    } catch {
      fail('DATABASE_URL', `a URL like mysql://user@host:3306/db: ${urlMistake(databaseUrl)}`);
    }
    if (!/^\/[A-Za-z0-9_]{1,64}$/.test(url.pathname)) {
      fail(
        'DATABASE_URL',
        'a mysql:// URL naming its database (letters, digits, _), like mysql://root@127.0.0.1:3306/library',
      );
    }
    database = { kind: 'mysql', url: url.toString() };
  } else if (/^postgres(ql)?:\/\//i.test(databaseUrl)) {
    let url;
    try {
      url = new URL(databaseUrl);
    } catch {
      fail('DATABASE_URL', `a URL like postgres://user@host:5432/db: ${urlMistake(databaseUrl)}`);
    }
    // `schema` is ours, not libpq's: it isolates one desk (or one test run) in its own schema.
    const schema = url.searchParams.get('schema') || 'public';
    if (!/^[A-Za-z_][A-Za-z0-9_]{0,62}$/.test(schema))
      fail('DATABASE_URL', 'a schema name of letters, digits, _');
    url.searchParams.delete('schema');
    // Ours too: `pooling=transaction` when the URL names PgBouncer in transaction pooling mode.
    const pooling = url.searchParams.get('pooling') || 'session';
    if (pooling !== 'session' && pooling !== 'transaction')
      fail('DATABASE_URL', 'pooling=session or pooling=transaction');
    url.searchParams.delete('pooling');
    database = { kind: 'postgres', url: url.toString(), schema, pooling };
  } else {
    const driver = env.SQLITE_DRIVER || undefined;
    if (driver !== undefined && driver !== 'better-sqlite3' && driver !== 'node:sqlite') {
      fail('SQLITE_DRIVER', '`better-sqlite3` or `node:sqlite`');
    }
    database = { kind: 'sqlite', filename: databaseUrl.replace(/^(sqlite|file):(\/\/)?/, ''), driver };
  }

  const storeUrl = env.IDEMPOTENCY_STORE || 'database';
  let keys;
  if (storeUrl === 'database' || storeUrl === 'memory') keys = { kind: storeUrl };
  else if (/^rediss?:\/\//.test(storeUrl)) {
    const url = new URL(storeUrl);
    // `prefix` is ours too: the Redis key prefix, so several desks (or test runs) share one Redis.
    const prefix = url.searchParams.get('prefix') || 'library-loans:';
    url.searchParams.delete('prefix');
    keys = { kind: 'redis', url: url.toString(), prefix };
  } else if (storeUrl.startsWith('redis+cluster://')) {
    // Not a WHATWG URL: the authority lists the cluster's seed nodes, `host:port,host:port`.
    const [nodes, query = ''] = storeUrl.slice('redis+cluster://'.length).replace(/\/$/, '').split('?');
    const clusterNodes = nodes.split(',').filter(Boolean);
    if (clusterNodes.length === 0 || !clusterNodes.every((node) => /^[^:,\s]+:\d{1,5}$/.test(node))) {
      fail('IDEMPOTENCY_STORE', 'redis+cluster://host:port,host:port (the seed nodes)');
    }
    const prefix = new URLSearchParams(query).get('prefix') || 'library-loans:';
    keys = { kind: 'redis-cluster', clusterNodes, prefix };
  } else fail('IDEMPOTENCY_STORE', '`database`, `memory`, a redis:// URL or redis+cluster://host:port,…');

  const mode = env.IDEMPOTENCY_MODE || (keys.kind === 'database' ? 'atomic' : 'lease');
  if (mode !== 'atomic' && mode !== 'lease') fail('IDEMPOTENCY_MODE', '`atomic` or `lease`');
  if (mode === 'atomic' && keys.kind !== 'database') {
    fail('IDEMPOTENCY_MODE', 'lease when IDEMPOTENCY_STORE keeps keys outside the database');
  }

  const required = env.IDEMPOTENCY_REQUIRED || 'false';
  if (required !== 'true' && required !== 'false') fail('IDEMPOTENCY_REQUIRED', '`true` or `false`');

  // Validated here too, so a bad key stops the start with the variable's name, not the option's.
  let encryptionKeys;
  if (env.IDEMPOTENCY_ENCRYPTION_KEY) {
    encryptionKeys = env.IDEMPOTENCY_ENCRYPTION_KEY.split(',').map((key) => key.trim());
    const aesKey = (key) => /^[A-Za-z0-9+/]{43}=$/.test(key) && Buffer.from(key, 'base64').length === 32;
    if (!encryptionKeys.every(aesKey)) {
      fail('IDEMPOTENCY_ENCRYPTION_KEY', 'base64 32-byte keys separated by commas, current first');
    }
  }

  const logLevel = env.LOG_LEVEL || 'info';
  if (!LOG_LEVELS.includes(logLevel)) fail('LOG_LEVEL', LOG_LEVELS.join(', '));
  if (env.SCOPE_SECRET && Buffer.byteLength(env.SCOPE_SECRET) < 16)
    fail('SCOPE_SECRET', 'at least 16 characters');
  const adminLoopback = env.ADMIN_LOOPBACK || '0';
  if (adminLoopback !== '0' && adminLoopback !== '1') fail('ADMIN_LOOPBACK', '`1` or `0`');
  const completer = env.COMPLETER || '1';
  if (completer !== '0' && completer !== '1') fail('COMPLETER', '`1` or `0`');
  const sendReceipts = env.RECEIPTS || '1';
  if (sendReceipts !== '0' && sendReceipts !== '1') fail('RECEIPTS', '`1` or `0`');
  const providerUrl = env.PROVIDER_URL || 'http://127.0.0.1:8484';
  if (!URL.canParse(providerUrl) || !/^https?:$/.test(new URL(providerUrl).protocol)) {
    fail('PROVIDER_URL', 'an http:// or https:// URL like http://127.0.0.1:8484');
  }
  const receiptsRedis = env.REDIS_URL || (keys.kind === 'redis' ? storeUrl : 'none');
  if (receiptsRedis !== 'none' && !/^rediss?:\/\//.test(receiptsRedis)) {
    fail('REDIS_URL', 'a redis:// URL like redis://127.0.0.1:6379, or `none`');
  }
  const demoFaults = env.DEMO_FAULTS || '0';
  if (demoFaults !== '0' && demoFaults !== '1') fail('DEMO_FAULTS', '`1` or `0`');
  const host = env.HOST || '127.0.0.1';
  // The faults let any caller kill the desk; and behind the fault proxy every caller reaches the
  // desk from loopback, which ADMIN_LOOPBACK trusts.
  if (demoFaults === '1' && !/^(127\.\d+\.\d+\.\d+|::1|localhost)$/.test(host)) {
    fail('HOST', 'a loopback address (127.0.0.1, ::1, localhost) with DEMO_FAULTS=1');
  }

  return {
    host,
    port,
    database,
    keys,
    mode,
    required: required === 'true',
    ttlMs: duration('IDEMPOTENCY_TTL', '24h'),
    leaseMs: duration('IDEMPOTENCY_LEASE', '10s'),
    waitMs: duration('IDEMPOTENCY_WAIT', '10s', 0),
    encryptionKeys,
    purgeIntervalMs: duration('PURGE_INTERVAL', '1m'),
    providerUrl,
    completer: completer === '1',
    completerIntervalMs: duration('COMPLETER_INTERVAL', '5s'),
    workers: integer('WORKERS', 1, 1),
    receipts: {
      send: sendReceipts === '1',
      delayMs: integer('RECEIPT_DELAY_MS', 0, 0),
      redis: bullRedis(receiptsRedis),
    },
    scopeSecret: env.SCOPE_SECRET || undefined,
    adminToken: env.ADMIN_TOKEN || undefined,
    adminLoopback: adminLoopback === '1',
    demoFaults: demoFaults === '1',
    logLevel,
  };
}

/** The BullMQ connection of a redis:// URL: its `prefix` names the queue's keys (library-loans:bull). */
function bullRedis(text) {
  if (text === 'none') return undefined;
  const url = new URL(text);
  const prefix = `${url.searchParams.get('prefix') || 'library-loans:'}bull`;
  url.searchParams.delete('prefix');
  return { url: url.toString(), prefix };
}

/**
 * What is wrong in a URL that `URL` refused (it says only "Invalid URL"): in a database URL, the
 * port or else the host of its authority.
 */
function urlMistake(text) {
  const authority = /^[^:]*:\/\/([^/?#]*)/.exec(text)?.[1] ?? '';
  const hostAndPort = authority.slice(authority.lastIndexOf('@') + 1);
  const { host, port } = /^(?<host>\[[^\]]*\]|[^:]*)(?::(?<port>.*))?$/.exec(hostAndPort).groups;
  if (port !== undefined && !(/^\d*$/.test(port) && Number(port) <= 65535)) {
    return `port ${port} is not a number from 0 to 65535`;
  }
  return `host ${JSON.stringify(host)} is not a host name, an IPv4 address or an [IPv6] address`;
}

/** One line saying what runs where, without credentials. */
export function describe(config) {
  const { database, keys } = config;
  const where =
    database.kind === 'sqlite'
      ? `SQLite ${database.filename}`
      : database.kind === 'mysql'
        ? `MySQL ${new URL(database.url).host}${new URL(database.url).pathname}`
        : `PostgreSQL ${new URL(database.url).host}${new URL(database.url).pathname} schema ${database.schema}`;
  const keyPlace = keys.kind === 'database' ? 'the database' : keys.kind === 'memory' ? 'memory' : 'Redis';
  return `${where}; keys in ${keyPlace}, ${config.mode} mode, kept ${ms(config.ttlMs, { long: true })}`;
}
