#!/usr/bin/env node
import { parseArgs } from 'node:util';
import type { IdempotencyStore, KeyRecordSummary } from './core/types.js';

const USAGE = `Usage:
  retrysafe migrate --database-url <url> [--schema <name>] [--table <name>] [--print]
  retrysafe purge   --database-url <url> [--schema <name>] [--table <name>] [--batch-size <n>]
  retrysafe keys list          <store> [--scope <scope>] [--limit <n>] [--after <cursor>] [--json]
  retrysafe keys show <key>    <store> [--scope <scope>] [--json]
  retrysafe keys delete <key>  <store> [--scope <scope>]

  <store> is --database-url <url> [--schema <name>] [--table <name>]
          or --redis-url <url> [--prefix <prefix>]

  --database-url  a postgres:// (or postgresql://) URL, or the path of a SQLite file;
                  defaults to the DATABASE_URL environment variable
  --schema        PostgreSQL schema of the table (default: public)
  --table         table of the records (default: idempotency_keys)
  --redis-url     a redis:// (or rediss://) URL, for keys kept in Redis
  --prefix        the Redis store's key prefix (default: retrysafe:)
  --batch-size    records deleted per statement by purge (default: 1000; SQLite 200)
  --print         print the SQL of migrate instead of running it, for your own migration tool
  --scope         the scope of the key (default: "", requests without credentials); list: only it
  --limit         records listed at most (default: 100)
  --after         list from this cursor on (printed under a list that has more)
  --json          print JSON instead of a table

migrate creates the table and its index when missing (safe to run again);
purge deletes the records whose retention has passed and prints how many;
keys list, show and delete inspect live records and free a key (delete exits 1 when there was none).`;

class UsageError extends Error {
  override readonly name = 'UsageError';
}

const POSTGRES_URL = /^postgres(ql)?:\/\//;
const DEFAULT_LIST_LIMIT = 100;

interface Target {
  store: IdempotencyStore;
  migrate: () => Promise<void>;
  label: string;
}

interface StoreArgs {
  databaseUrl?: string;
  redisUrl?: string;
  schema?: string;
  table?: string;
  prefix?: string;
}

async function openStore(createFile: boolean, args: StoreArgs): Promise<Target> {
  const { databaseUrl, redisUrl, schema, table, prefix } = args;
  // Imported on demand: a SQLite user need not install pg or ioredis, and so on.
  if (redisUrl !== undefined) {
    const { redisStore } = await import('./stores/redis.js');
    const store = redisStore({ url: redisUrl, prefix });
    return { store, migrate: async () => {}, label: `prefix ${prefix ?? 'retrysafe:'}` };
  }
  if (prefix !== undefined) throw new UsageError('--prefix applies to Redis only');
  if (databaseUrl === undefined) throw new UsageError('--database-url (or DATABASE_URL) is required');
  if (POSTGRES_URL.test(databaseUrl)) {
    const { postgresStore } = await import('./stores/postgres.js');
    const store = postgresStore({ connectionString: databaseUrl, schema, table, maxConnections: 1 });
    return {
      store,
      migrate: () => store.migrate(),
      label: `"${schema ?? 'public'}"."${table ?? 'idempotency_keys'}"`,
    };
  }
  if (schema !== undefined) throw new UsageError('--schema applies to PostgreSQL only');
  if (!createFile) {
    // Only migrate may create the file: a mistyped path fails instead of opening a new, empty database.
    const { default: Database } = await import('better-sqlite3');
    try {
      new Database(databaseUrl, { readonly: true, fileMustExist: true }).close();
    } catch (error) {
      throw new Error(`cannot open the SQLite database ${databaseUrl}: ${(error as Error).message}`);
    }
  }
  const { sqliteStore } = await import('./stores/sqlite.js');
  // The SQLite store creates its table and index when it opens the file.
  const store = sqliteStore({ filename: databaseUrl, table });
  return { store, migrate: async () => {}, label: `"${table ?? 'idempotency_keys'}" in ${databaseUrl}` };
}

async function migrationSql(databaseUrl: string, schema?: string, table?: string): Promise<string[]> {
  if (POSTGRES_URL.test(databaseUrl)) {
    const { postgresMigrationSql } = await import('./stores/postgres.js');
    return postgresMigrationSql({ schema, table });
  }
  if (schema !== undefined) throw new UsageError('--schema applies to PostgreSQL only');
  const { sqliteMigrationSql } = await import('./stores/sqlite.js');
  return sqliteMigrationSql({ table });
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

function cells(r: KeyRecordSummary): string[] {
  return [
    word(r.scope),
    word(r.key),
    r.state,
    r.status === null ? '-' : String(r.status),
    time(r.createdAtMs),
    time(r.expiresAtMs),
    time(r.leaseUntilMs),
  ];
}

interface KeysArgs {
  scope?: string;
  limit?: number;
  after?: string;
  json: boolean;
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
    const record = await store.get(scope, key!);
    if (!record) throw new Error(`no live record of ${where}`);
    if (args.json) console.log(JSON.stringify(record, null, 2));
    else {
      const values = cells(record);
      console.log(table(COLUMNS.map((name, i) => [name, values[i]!])));
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
      schema: { type: 'string' },
      table: { type: 'string' },
      prefix: { type: 'string' },
      'batch-size': { type: 'string' },
      print: { type: 'boolean' },
      scope: { type: 'string' },
      limit: { type: 'string' },
      after: { type: 'string' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const [command, ...rest] = positionals;
  const stores: StoreArgs = {
    databaseUrl:
      values['database-url'] ?? (values['redis-url'] ? undefined : process.env.DATABASE_URL || undefined),
    redisUrl: values['redis-url'],
    schema: values.schema,
    table: values.table,
    prefix: values.prefix,
  };
  if (stores.databaseUrl !== undefined && stores.redisUrl !== undefined) {
    throw new UsageError('give --database-url or --redis-url, not both');
  }
  const only = (allowed: boolean, option: string, where: string) => {
    if (!allowed) throw new UsageError(`${option} applies to ${where} only`);
  };
  const batchSize = positiveInteger('batch-size', values['batch-size']);
  only(batchSize === undefined || command === 'purge', '--batch-size', 'purge');
  only(!values.print || command === 'migrate', '--print', 'migrate');
  for (const option of ['scope', 'limit', 'after', 'json'] as const) {
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
    const args = {
      scope: values.scope,
      limit: positiveInteger('limit', values.limit),
      after: values.after,
      json: values.json === true,
    };
    if (stores.databaseUrl === undefined && stores.redisUrl === undefined) {
      throw new UsageError('keys needs --database-url (or DATABASE_URL) or --redis-url');
    }
    const target = await openStore(false, stores);
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
  if (!stores.databaseUrl) throw new UsageError('--database-url (or DATABASE_URL) is required');
  if (values.print) {
    console.log(`${(await migrationSql(stores.databaseUrl, values.schema, values.table)).join(';\n\n')};`);
    return;
  }

  const target = await openStore(command === 'migrate', stores);
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
  process.exitCode = usage ? 2 : 1;
});
