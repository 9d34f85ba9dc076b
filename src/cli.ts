#!/usr/bin/env node
import { existsSync, readFileSync } from 'node:fs';
import { STATUS_CODES } from 'node:http';
import { parseArgs } from 'node:util';
import type { IdempotencyStore, KeyRecordSummary } from './core/contract/index.js';
import { type StoredResponseView, storedResponseView } from './core/response/index.js';
import {
  driverPackage,
  openSqlStore,
  type SqlEngine,
  sqlEngineOf,
  sqlMigrationOf,
} from './stores/registry.js';
import { isTableMissing } from './stores/sql/table-missing.js';

const USAGE = `Usage:
  retrysafe migrate --database-url <url> [--schema <name>] [--table <name>] [--pooling <mode>] [--print]
  retrysafe purge   --database-url <url> [--schema <name>] [--table <name>] [--pooling <mode>] [--batch-size <n>]
  retrysafe keys list          <store> [--scope <scope>] [--limit <n>] [--after <cursor>] [--json]
  retrysafe keys show <key>    <store> [--scope <scope>] [--response] [--json]
  retrysafe keys delete <key>  <store> [--scope <scope>]
  retrysafe --version

  <store> is --database-url <url> [--schema <name>] [--table <name>] [--pooling <mode>]
          or --redis-url <url> [--prefix <prefix>]
          or --redis-cluster <host:port,...> [--prefix <prefix>]

  --database-url  a postgres:// (or postgresql://) URL, a mysql:// URL naming its database
                  (MySQL or MariaDB), or the path of a SQLite file ending
                  .db, .sqlite or .sqlite3; anything else is refused. Defaults to the
                  DATABASE_URL environment variable
  --schema        PostgreSQL schema of the table (default: public)
  --table         table of the records (default: idempotency_keys)
  --pooling       PostgreSQL: session (default) or transaction, for a URL that reaches PostgreSQL
                  through a pooler in transaction mode (PgBouncer's pool_mode = transaction)
  --redis-url     a redis:// (or rediss://) URL, for keys kept in Redis
  --redis-cluster seed nodes of a Redis Cluster, comma-separated; keys list walks every master
  --prefix        the Redis store's key prefix (default: retrysafe:)
  --batch-size    records deleted per statement by purge (default: 1000; SQLite 200)
  --print         print the SQL of migrate instead of running it, for your own migration tool
  --scope         the scope of the key (default: "", requests without credentials); list: only it
  --limit         records listed at most (default: 100)
  --after         list from this cursor on (printed under a list that has more)
  --json          print JSON instead of a table
  --response      show: the saved answer too (status, headers, body: text, or base64 when not
                  UTF-8); IDEMPOTENCY_ENCRYPTION_KEY (base64 keys, comma-separated, as the
                  service's encryptionKey) opens an encrypted body, else it shows sealed

migrate creates the table and its index when missing (safe to run again);
purge deletes the records whose retention has passed and prints how many;
keys list, show and delete inspect live records and free a key (delete exits 1 when there was none);
they create nothing: a table or schema that does not exist is refused.`;

class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** What a command names does not exist (a file, a table): exit 2, without the usage text. */
class NotFound extends Error {
  override readonly name = 'NotFound';
}

/** Which store a --database-url names; a usage error when it names none. */
function databaseKind(databaseUrl: string): SqlEngine {
  const engine = sqlEngineOf(databaseUrl);
  if (engine) return engine;
  throw new UsageError(
    `--database-url ${JSON.stringify(databaseUrl)} is neither a postgres:// or mysql:// URL nor a SQLite file (ending .db, .sqlite or .sqlite3)`,
  );
}

const DEFAULT_LIST_LIMIT = 100;

interface Target {
  store: IdempotencyStore;
  migrate: () => Promise<void>;
  label: string;
}

interface StoreArgs {
  databaseUrl?: string;
  redisUrl?: string;
  /** `host:port,host:port`: seed nodes of a Redis Cluster. */
  redisCluster?: string;
  schema?: string;
  table?: string;
  /** PostgreSQL only: `postgresStore`'s `pooling`. */
  pooling?: 'session' | 'transaction';
  prefix?: string;
}

/**
 * Opens the store the arguments name, through the stores' registry (src/stores/registry.ts). Only
 * `migrate` creates anything: every other command refuses a file, schema or table that does not
 * exist, so a typo fails instead of making one.
 */
async function openStore(command: 'migrate' | 'purge' | 'keys', args: StoreArgs): Promise<Target> {
  const { databaseUrl, redisUrl, redisCluster, schema, table, pooling, prefix } = args;
  // Imported on demand: a SQLite user need not install pg or ioredis, and so on.
  if (redisUrl !== undefined || redisCluster !== undefined) {
    if (schema !== undefined) throw new UsageError('--schema applies to PostgreSQL only');
    if (table !== undefined) throw new UsageError('--table applies to SQLite, PostgreSQL and MySQL only');
    if (pooling !== undefined) throw new UsageError('--pooling applies to PostgreSQL only');
    await driverPackage(() => import('ioredis'), 'ioredis');
    const { redisStore } = await import('./stores/redis/index.js');
    const clusterNodes = redisCluster?.split(',').filter((node) => node !== '');
    if (clusterNodes?.length === 0)
      throw new UsageError('--redis-cluster needs host:port of one node or more');
    const store =
      redisUrl !== undefined ? redisStore({ url: redisUrl, prefix }) : redisStore({ clusterNodes, prefix });
    return { store, migrate: async () => {}, label: `prefix ${prefix ?? 'retrysafe:'}` };
  }
  if (prefix !== undefined) throw new UsageError('--prefix applies to Redis only');
  if (databaseUrl === undefined) throw new UsageError('--database-url (or DATABASE_URL) is required');
  const engine = databaseKind(databaseUrl);
  if (engine !== 'postgres' && schema !== undefined)
    throw new UsageError('--schema applies to PostgreSQL only');
  if (engine !== 'postgres' && pooling !== undefined)
    throw new UsageError('--pooling applies to PostgreSQL only');
  if (engine === 'sqlite' && command !== 'migrate' && !existsSync(databaseUrl)) {
    throw new NotFound(`no SQLite database ${databaseUrl}: check --database-url`);
  }
  const { store, label } = await openSqlStore(databaseUrl, { schema, table, pooling, maxConnections: 1 });
  if (command !== 'migrate') {
    // Every SQL store refuses a missing table with the same error: asked once, it creates nothing.
    try {
      await store.list({ limit: 1 });
    } catch (error) {
      await store.close();
      if (isTableMissing(error)) {
        const names = engine === 'postgres' ? '--schema and --table' : '--table';
        throw new NotFound(`no table ${label}: check ${names}, or create it with migrate`);
      }
      pgbouncerHint(error);
    }
  }
  return { store, migrate: () => store.migrate().catch(pgbouncerHint), label };
}

/**
 * The store's refusal of a connection by PgBouncer (a ConfigError naming the store's `pooling`
 * option), said with the flag that avoids it.
 */
function pgbouncerHint(error: unknown): never {
  const refused = (error as { cause?: Error }).cause?.message.startsWith('unsupported startup parameter');
  if (!refused) throw error;
  throw new UsageError(
    `the server refused the connection's startup parameters, as PgBouncer in transaction mode does: add --pooling transaction (${(error as { cause: Error }).cause.message})`,
  );
}

async function migrationSql(databaseUrl: string, schema?: string, table?: string): Promise<string[]> {
  if (databaseKind(databaseUrl) !== 'postgres' && schema !== undefined) {
    throw new UsageError('--schema applies to PostgreSQL only');
  }
  return sqlMigrationOf(databaseUrl, { schema, table });
}

function poolingMode(value: string | undefined): StoreArgs['pooling'] {
  if (value === undefined || value === 'session' || value === 'transaction') return value;
  throw new UsageError(`--pooling must be session or transaction; got ${JSON.stringify(value)}`);
}

function positiveInteger(option: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const parsed = Number(value);
  if (!(Number.isSafeInteger(parsed) && parsed > 0))
    throw new UsageError(`--${option} must be a positive integer`);
  return parsed;
}

const time = (ms: number | null) => (ms === null ? '-' : new Date(ms).toISOString());

/** Columns padded to their widest cell; the last one is not padded. */
function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)));
  return rows
    .map((row) =>
      row.map((cell, column) => (column === row.length - 1 ? cell : cell.padEnd(widths[column]!))).join('  '),
    )
    .join('\n');
}

const COLUMNS = ['scope', 'key', 'state', 'status', 'created', 'expires', 'lease until'];

// JSON quoting only where a scope or key would otherwise blur the columns.
const word = (text: string) => (/^[\x21-\x7e]+$/.test(text) ? text : JSON.stringify(text));

/** At most 40 characters: a longer scope or key keeps both ends (keys differ at the end: a counter, a UUID). */
const cut = (text: string) => (text.length <= 40 ? text : `${text.slice(0, 19)}…${text.slice(-20)}`);

function cells(r: KeyRecordSummary): string[] {
  return [
    cut(word(r.scope)),
    cut(word(r.key)),
    r.state,
    r.status === null ? '-' : String(r.status),
    time(r.createdAtMs),
    time(r.expiresAtMs),
    time(r.leaseUntilMs),
  ];
}

/** A saved answer as an HTTP response reads: status line, headers, a blank line, the body. */
function answerText(response: StoredResponseView): string {
  const lines = [`${response.status} ${STATUS_CODES[response.status] ?? ''}`.trimEnd()];
  for (const [name, value] of Object.entries(response.headers)) lines.push(`${name}: ${value}`);
  lines.push('');
  if (response.bodyUnreadable) lines.push('(the body cannot be decrypted with IDEMPOTENCY_ENCRYPTION_KEY)');
  else if (response.body !== undefined) lines.push(response.body);
  else lines.push(`(not UTF-8; base64) ${response.bodyBase64}`);
  return lines.join('\n');
}

interface KeysArgs {
  scope?: string;
  limit?: number;
  after?: string;
  json: boolean;
  response: boolean;
  encryptionKey?: string[];
}

/** `list` pages until `limit` records or the end (a Redis page may hold fewer than asked). */
async function listKeys(
  store: IdempotencyStore,
  { scope, limit = DEFAULT_LIST_LIMIT, after, json }: KeysArgs,
) {
  const records: KeyRecordSummary[] = [];
  let next: string | null = after ?? null;
  do {
    const page = await store.list({ scope, limit: limit - records.length, after: next ?? undefined });
    records.push(...page.records);
    next = page.next;
  } while (next !== null && records.length < limit);
  if (json) {
    console.log(JSON.stringify({ records, next }, null, 2));
    return;
  }
  if (records.length > 0) console.log(table([COLUMNS.map((c) => c.toUpperCase()), ...records.map(cells)]));
  else console.log('no live records');
  if (next !== null) console.log(`\nmore: add --after ${next}`);
}

async function keys(target: Target, action: string, key: string | undefined, args: KeysArgs): Promise<void> {
  const { store } = target;
  if (action === 'list') return listKeys(store, args);
  const scope = args.scope ?? '';
  const where = `${JSON.stringify(key)} in scope ${JSON.stringify(scope)}`;
  if (action === 'show') {
    const found = await store.get(scope, key!, { response: args.response });
    if (!found) {
      // The CLI's default scope is "" (requests without credentials); a service usually keeps
      // its keys under a scope of its own (the loan desk: `anonymous` or a credential digest).
      throw new Error(
        `no live record of ${where}${args.scope === undefined ? ' (the default scope)' : ''}; ` +
          'give the scope the service keeps it under with --scope, and find it with `retrysafe keys list`',
      );
    }
    const { response: saved, ...record } = found;
    const response = saved && storedResponseView(saved, { encryptionKey: args.encryptionKey });
    if (args.json) console.log(JSON.stringify(response ? { ...record, response } : record, null, 2));
    else {
      const values = cells(record);
      // The finished steps by name (their results may be sensitive and are not shown).
      const steps = record.steps?.join(', ') ?? '-';
      console.log(table([...COLUMNS.map((name, i) => [name, values[i]!]), ['steps', steps]]));
      if (response) console.log(`\n${answerText(response)}`);
      else if (args.response) console.log('\nno saved answer: the record is in progress');
    }
    return;
  }
  if (!(await store.delete(scope, key!))) throw new Error(`no live record of ${where}`);
  console.log(`deleted ${where}`);
}

async function main(argv: string[]): Promise<void> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      'database-url': { type: 'string' },
      'redis-url': { type: 'string' },
      'redis-cluster': { type: 'string' },
      schema: { type: 'string' },
      table: { type: 'string' },
      pooling: { type: 'string' },
      prefix: { type: 'string' },
      'batch-size': { type: 'string' },
      print: { type: 'boolean' },
      scope: { type: 'string' },
      limit: { type: 'string' },
      after: { type: 'string' },
      json: { type: 'boolean' },
      response: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
      version: { type: 'boolean' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return;
  }
  if (values.version) {
    const manifest = new URL('../package.json', import.meta.url);
    console.log((JSON.parse(readFileSync(manifest, 'utf8')) as { version: string }).version);
    return;
  }
  const [command, ...rest] = positionals;
  const redis = values['redis-url'] ?? values['redis-cluster'];
  const stores: StoreArgs = {
    databaseUrl: values['database-url'] ?? (redis ? undefined : process.env.DATABASE_URL || undefined),
    redisUrl: values['redis-url'],
    redisCluster: values['redis-cluster'],
    schema: values.schema,
    table: values.table,
    pooling: poolingMode(values.pooling),
    prefix: values.prefix,
  };
  const named = [stores.databaseUrl, stores.redisUrl, stores.redisCluster].filter((s) => s !== undefined);
  if (named.length > 1) throw new UsageError('give one of --database-url, --redis-url or --redis-cluster');
  const only = (allowed: boolean, option: string, where: string) => {
    if (!allowed) throw new UsageError(`${option} applies to ${where} only`);
  };
  const batchSize = positiveInteger('batch-size', values['batch-size']);
  only(batchSize === undefined || command === 'purge', '--batch-size', 'purge');
  only(!values.print || command === 'migrate', '--print', 'migrate');
  for (const option of ['scope', 'limit', 'after', 'json', 'response'] as const) {
    only(values[option] === undefined || command === 'keys', `--${option}`, 'keys');
  }

  if (command === 'keys') {
    const [action, key, ...extra] = rest;
    if (action !== 'list' && action !== 'show' && action !== 'delete') {
      throw new UsageError(
        action ? `unknown keys command ${JSON.stringify(action)}` : 'keys: list, show or delete?',
      );
    }
    if (action !== 'list' && key === undefined) throw new UsageError(`keys ${action} needs a key`);
    const unexpected = action === 'list' ? key : extra[0];
    if (unexpected !== undefined) throw new UsageError(`unexpected argument ${JSON.stringify(unexpected)}`);
    only(
      action === 'list' || (values.limit === undefined && values.after === undefined),
      '--limit and --after',
      'keys list',
    );
    only(!values.response || action === 'show', '--response', 'keys show');
    const encryptionKey = process.env.IDEMPOTENCY_ENCRYPTION_KEY;
    const args = {
      scope: values.scope,
      limit: positiveInteger('limit', values.limit),
      after: values.after,
      json: values.json === true,
      response: values.response === true,
      encryptionKey: encryptionKey ? encryptionKey.split(',').map((k) => k.trim()) : undefined,
    };
    if (named.length === 0) {
      throw new UsageError('keys needs --database-url (or DATABASE_URL), --redis-url or --redis-cluster');
    }
    const target = await openStore('keys', stores);
    try {
      await keys(target, action, key, args);
    } finally {
      await target.store.close();
    }
    return;
  }

  if (command !== 'migrate' && command !== 'purge') {
    throw new UsageError(command ? `unknown command ${JSON.stringify(command)}` : 'no command given');
  }
  if (rest.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(rest[0])}`);
  only(stores.redisUrl === undefined, '--redis-url', 'keys');
  only(stores.redisCluster === undefined, '--redis-cluster', 'keys');
  if (!stores.databaseUrl) throw new UsageError('--database-url (or DATABASE_URL) is required');
  if (values.print) {
    console.log(`${(await migrationSql(stores.databaseUrl, values.schema, values.table)).join(';\n\n')};`);
    return;
  }

  const target = await openStore(command, stores);
  try {
    if (command === 'migrate') {
      await target.migrate();
      console.log(`migrated ${target.label}`);
    } else {
      const deleted = await target.store.purgeExpired(batchSize);
      console.log(`purged ${deleted} expired records from ${target.label}`);
    }
  } finally {
    await target.store.close();
  }
}

main(process.argv.slice(2)).catch((error: unknown) => {
  const usage =
    error instanceof UsageError || (error as { code?: string }).code?.startsWith('ERR_PARSE_ARGS');
  console.error(`retrysafe: ${error instanceof Error ? error.message : String(error)}`);
  if (usage) console.error(`\n${USAGE}`);
  process.exitCode = usage || error instanceof NotFound ? 2 : 1;
});
