import { existsSync } from 'node:fs';
import { ConfigError } from '../core/contract/index.js';
import type { IdempotencyStore } from '../core/store.js';

/** The engines a SQL store runs on, each named by the URL of its database. */
export type SqlEngine = 'postgres' | 'mysql' | 'sqlite';

/** What opens a SQL store from a URL: the `retrysafe` CLI's stores, on the one option vocabulary. */
export interface OpenSqlStoreOptions {
  /** PostgreSQL only. */
  schema?: string;
  table?: string;
  /** PostgreSQL only: `postgresStore`'s `pooling`. */
  pooling?: 'session' | 'transaction';
  maxConnections?: number;
  /** Refuse a SQLite file that does not exist instead of creating it. */
  mustExist?: boolean;
}

/** A SQL store opened by {@link openSqlStore}, with what names its table in messages. */
export interface OpenedSqlStore {
  engine: SqlEngine;
  store: IdempotencyStore & { migrate(): Promise<void> };
  /** The table, as its engine names it: `"public"."idempotency_keys"`, `` `keys` in shop ``. */
  label: string;
}

// A SQLite file is named by its extension, so a URL whose scheme was mistyped or forgotten
// (`postgres@host:5432`, `postgress://…`) is refused instead of becoming a new file of that name.
const ENGINES: readonly { engine: SqlEngine; matches: RegExp }[] = [
  { engine: 'postgres', matches: /^postgres(ql)?:\/\// },
  { engine: 'mysql', matches: /^mysql:\/\// },
  { engine: 'sqlite', matches: /\.(db|sqlite3?)$/i },
];

/** The engine whose database `url` names; `undefined` when it names none. */
export function sqlEngineOf(url: string): SqlEngine | undefined {
  return ENGINES.find(({ matches }) => matches.test(url))?.engine;
}

/**
 * Opens the SQL store of the database `url` names, each with its own store and the same options
 * (`url`, `table`, `schema`): `postgresStore`, `mysqlStore` or `sqliteStore` (better-sqlite3 where
 * it is installed, else Node's own `node:sqlite`). The store creates nothing until `migrate()`.
 * Drivers load on demand, so a SQLite user need not install `pg`; a missing one says what to install.
 */
export async function openSqlStore(url: string, options: OpenSqlStoreOptions = {}): Promise<OpenedSqlStore> {
  const engine = sqlEngineOf(url);
  if (!engine) {
    throw new ConfigError(
      `${JSON.stringify(url)} is neither a postgres:// or mysql:// URL nor a SQLite file (ending .db, .sqlite or .sqlite3)`,
    );
  }
  const { schema, table, pooling, maxConnections, mustExist } = options;
  if (engine !== 'postgres' && schema !== undefined)
    throw new ConfigError('`schema` applies to PostgreSQL only');
  if (engine !== 'postgres' && pooling !== undefined)
    throw new ConfigError('`pooling` applies to PostgreSQL only');
  const tableName = table ?? 'idempotency_keys';
  switch (engine) {
    case 'postgres': {
      await driverPackage(() => import('pg'), 'pg');
      const { postgresStore } = await import('./postgres/index.js');
      const store = postgresStore({ url, schema, table, pooling, maxConnections });
      return { engine, store, label: `"${schema ?? 'public'}"."${tableName}"` };
    }
    case 'mysql': {
      await driverPackage(() => import('mysql2/promise'), 'mysql2');
      const { mysqlStore } = await import('./mysql/index.js');
      const store = mysqlStore({ url, table, maxConnections });
      return { engine, store, label: `\`${tableName}\` in ${new URL(url).pathname.slice(1)}` };
    }
    case 'sqlite': {
      // Checked before the store opens the file, which would create it (a typo then makes one).
      if (mustExist && !existsSync(url)) throw new ConfigError(`no SQLite database ${url}`);
      const { sqliteStore } = await import('./sqlite/index.js');
      return { engine, store: sqliteStore({ url, table }), label: `"${tableName}" in ${url}` };
    }
  }
}

/** The SQL that makes the table of `url`'s engine, for a migration tool of the application's. */
export async function sqlMigrationOf(
  url: string,
  options: Pick<OpenSqlStoreOptions, 'schema' | 'table'>,
): Promise<string[]> {
  const engine = sqlEngineOf(url);
  if (engine !== 'postgres' && options.schema !== undefined) {
    throw new ConfigError('`schema` applies to PostgreSQL only');
  }
  switch (engine) {
    case 'postgres':
      return (await import('./postgres/migrate.js')).postgresMigrationSql(options);
    case 'mysql':
      return (await import('./mysql/migrate.js')).mysqlMigrationSql(options);
    case 'sqlite':
      return (await import('./sqlite/migrate.js')).sqliteMigrationSql(options);
    default:
      throw new ConfigError(
        `${JSON.stringify(url)} is neither a postgres:// or mysql:// URL nor a SQLite file (ending .db, .sqlite or .sqlite3)`,
      );
  }
}

/** The store drivers are optional peer dependencies: a missing one says what to install. */
export async function driverPackage<T>(load: () => Promise<T>, name: string): Promise<T> {
  try {
    return await load();
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code !== 'ERR_MODULE_NOT_FOUND' || !(error as Error).message.includes(`'${name}'`)) throw error;
    throw new ConfigError(`this store needs the ${name} package: npm install ${name}`, { cause: error });
  }
}
