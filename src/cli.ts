#!/usr/bin/env node
import { parseArgs } from 'node:util';
import type { IdempotencyStore } from './core/types.js';

const USAGE = `Usage:
  retrysafe migrate --database-url <url> [--schema <name>] [--table <name>] [--print]
  retrysafe purge   --database-url <url> [--schema <name>] [--table <name>] [--batch-size <n>]

  --database-url  a postgres:// (or postgresql://) URL, or the path of a SQLite file;
                  defaults to the DATABASE_URL environment variable
  --schema        PostgreSQL schema of the table (default: public)
  --table         table of the records (default: idempotency_keys)
  --batch-size    records deleted per statement by purge (default: 1000)
  --print         print the SQL of migrate instead of running it, for your own migration tool

migrate creates the table and its index when missing (safe to run again);
purge deletes the records whose retention has passed and prints how many.`;

class UsageError extends Error {
  override readonly name = 'UsageError';
}

const POSTGRES_URL = /^postgres(ql)?:\/\//;

interface Target {
  store: IdempotencyStore;
  migrate: () => Promise<void>;
  label: string;
}

async function openStore(
  command: 'migrate' | 'purge',
  databaseUrl: string,
  schema?: string,
  table?: string,
): Promise<Target> {
  // Imported on demand: a SQLite user need not install pg, nor a PostgreSQL user better-sqlite3.
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
  if (command === 'purge') {
    // Only migrate may create the file: a mistyped path fails instead of purging a new, empty database.
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

async function main(argv: string[]): Promise<void> {
  const { positionals, values } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      'database-url': { type: 'string' },
      schema: { type: 'string' },
      table: { type: 'string' },
      'batch-size': { type: 'string' },
      print: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const [command, ...extra] = positionals;
  if (command !== 'migrate' && command !== 'purge') {
    throw new UsageError(command ? `unknown command ${JSON.stringify(command)}` : 'no command given');
  }
  if (extra.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(extra[0])}`);
  const databaseUrl = values['database-url'] ?? process.env.DATABASE_URL;
  if (!databaseUrl) throw new UsageError('--database-url (or DATABASE_URL) is required');
  const batchSize = values['batch-size'] === undefined ? undefined : Number(values['batch-size']);
  if (batchSize !== undefined && !(Number.isSafeInteger(batchSize) && batchSize > 0)) {
    throw new UsageError('--batch-size must be a positive integer');
  }
  if (command === 'migrate' && batchSize !== undefined)
    throw new UsageError('--batch-size applies to purge only');
  if (command === 'purge' && values.print) throw new UsageError('--print applies to migrate only');
  if (values.print) {
    console.log(`${(await migrationSql(databaseUrl, values.schema, values.table)).join(';\n\n')};`);
    return;
  }

  const target = await openStore(command, databaseUrl, values.schema, values.table);
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
