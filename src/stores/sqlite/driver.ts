import { createRequire } from 'node:module';
import type BetterSqlite3 from 'better-sqlite3';
import { ConfigError } from '../../core/contract/index.js';

/** The SQLite bindings {@link sqliteStore} can run on. */
export type SqliteDriverName = 'better-sqlite3' | 'node:sqlite';

/**
 * The members of Node's own `node:sqlite` `DatabaseSync` (Node ≥ 22.16) that the SQLite store
 * uses, so a `DatabaseSync` can be passed without the types of Node 22 being installed.
 */
export interface NodeSqliteDatabase {
  /** Runs one or more statements without results. */
  exec(sql: string): void;
  /** Compiles one statement. */
  prepare(sql: string): NodeSqliteStatement;
  /** Closes the connection. */
  close(): void;
  /** Whether a transaction is open on the connection (Node ≥ 22.16). */
  readonly isTransaction: boolean;
}

/** A compiled `node:sqlite` statement (`StatementSync`), as far as the SQLite store uses it. */
export interface NodeSqliteStatement {
  /** Runs the statement; `changes` counts the rows it changed. */
  run(...parameters: unknown[]): { changes: number | bigint };
  /** The first row, or `undefined`. */
  get(...parameters: unknown[]): unknown;
  /** Every row. */
  all(...parameters: unknown[]): unknown[];
}

/** A connection of either driver: better-sqlite3's `Database` or node:sqlite's `DatabaseSync`. */
export type SqliteDatabase = BetterSqlite3.Database | NodeSqliteDatabase;

/** A statement as the store calls it, whichever driver compiled it (neither reads big integers). */
export interface Statement {
  run(...parameters: unknown[]): { changes: number };
  get(...parameters: unknown[]): unknown;
  all(...parameters: unknown[]): unknown[];
}

/** The few places where the two drivers differ; everything else is SQL both run alike. */
export interface Driver {
  readonly name: SqliteDriverName;
  prepare(sql: string): Statement;
  exec(sql: string): void;
  inTransaction(): boolean;
  close(): void;
}

/** The Node release whose `node:sqlite` has everything the store needs (`isTransaction`). */
export const NODE_SQLITE_MIN_VERSION = '22.16.0';

const load = createRequire(import.meta.url);

function atLeast(version: string, minimum: string): boolean {
  const [major, minor] = version.split('.').map(Number);
  const [minMajor, minMinor] = minimum.split('.').map(Number);
  return major! > minMajor! || (major === minMajor && minor! >= minMinor!);
}

/** Whether this Node's `node:sqlite` can carry the store (it is there unflagged, with `isTransaction`). */
export function nodeSqliteAvailable(): boolean {
  return atLeast(process.versions.node, NODE_SQLITE_MIN_VERSION);
}

function betterSqlite3(): typeof BetterSqlite3 | undefined {
  try {
    return load('better-sqlite3') as typeof BetterSqlite3;
  } catch (error) {
    if ((error as { code?: string }).code === 'MODULE_NOT_FOUND') return undefined;
    throw error;
  }
}

/** SQLITE_BUSY: another connection holds the lock (better-sqlite3 names it, node:sqlite numbers it). */
export function isBusyError(error: unknown): boolean {
  const { code, errcode } = error as { code?: string; errcode?: number };
  return code === 'SQLITE_BUSY' || errcode === 5;
}

function isBetterSqlite3(database: SqliteDatabase): database is BetterSqlite3.Database {
  return typeof (database as Partial<BetterSqlite3.Database>).pragma === 'function';
}

/** The driver over a connection the caller opened; which one is told by the connection's shape. */
export function driverOf(database: SqliteDatabase): Driver {
  if (typeof (database as Partial<SqliteDatabase>).prepare !== 'function') {
    throw new ConfigError(
      'sqliteStore: `database` must be a better-sqlite3 Database or a node:sqlite DatabaseSync',
    );
  }
  if (isBetterSqlite3(database)) {
    return {
      name: 'better-sqlite3',
      prepare: (sql) => database.prepare(sql) as Statement,
      exec: (sql) => void database.exec(sql),
      inTransaction: () => database.inTransaction,
      close: () => void database.close(),
    };
  }
  if (typeof database.isTransaction !== 'boolean') {
    throw new ConfigError(
      `sqliteStore: node:sqlite needs Node ≥ ${NODE_SQLITE_MIN_VERSION} (DatabaseSync.isTransaction); this is Node ${process.versions.node}`,
    );
  }
  return {
    name: 'node:sqlite',
    prepare: (sql) => database.prepare(sql) as Statement,
    exec: (sql) => database.exec(sql),
    inTransaction: () => database.isTransaction,
    close: () => database.close(),
  };
}

/** The value of a PRAGMA that answers one (`busy_timeout`, `journal_mode`), on either binding. */
export function pragmaValue(db: Driver, name: string): unknown {
  return Object.values(db.prepare(`PRAGMA ${name}`).get() as object)[0];
}

/**
 * The path of `db`'s main file when it is a file in WAL mode; `undefined` for a database in memory
 * or in another journal mode.
 */
export function walFile(db: Driver): string | undefined {
  const main = (db.prepare('PRAGMA database_list').all() as { name: string; file: string }[]).find(
    (database) => database.name === 'main',
  );
  const mode = String(pragmaValue(db, 'journal_mode'));
  return main?.file && mode.toLowerCase() === 'wal' ? main.file : undefined;
}

/**
 * A second, read-only connection to `db`'s file, of the same binding, when `db` is a file in WAL
 * mode (there a reader sees what has committed and never waits for the write lock); `undefined`
 * for a database in memory or in another journal mode.
 */
export function openReader(db: Driver, busyTimeoutMs: number): Driver | undefined {
  const file = walFile(db);
  if (!file) return undefined;
  if (db.name === 'better-sqlite3') {
    // Not resolvable from here (a strict package layout): the store then reads on `db` alone.
    const Database = betterSqlite3();
    if (!Database) return undefined;
    return driverOf(new Database(file, { readonly: true, fileMustExist: true, timeout: busyTimeoutMs }));
  }
  const { DatabaseSync } = load('node:sqlite') as {
    DatabaseSync: new (filename: string, options: { readOnly: boolean }) => NodeSqliteDatabase;
  };
  const reader = new DatabaseSync(file, { readOnly: true });
  reader.exec(`PRAGMA busy_timeout = ${busyTimeoutMs}`);
  return driverOf(reader);
}

/**
 * Opens `filename` with the named driver, or by default with better-sqlite3 where it is installed
 * and node:sqlite where it is not (Node ≥ 22.16).
 */
export function openDatabase(
  filename: string,
  driver: SqliteDriverName | undefined,
  busyTimeoutMs: number,
): SqliteDatabase {
  const Database = driver === 'node:sqlite' ? undefined : betterSqlite3();
  if (Database) return new Database(filename, { timeout: busyTimeoutMs });
  if (driver === 'better-sqlite3') {
    throw new ConfigError(
      'sqliteStore: driver `better-sqlite3` is not installed (npm install better-sqlite3)',
    );
  }
  if (!nodeSqliteAvailable()) {
    throw new ConfigError(
      `sqliteStore: ${driver === undefined ? 'better-sqlite3 is not installed, and ' : ''}node:sqlite needs Node ≥ ${NODE_SQLITE_MIN_VERSION}; this is Node ${process.versions.node}`,
    );
  }
  const { DatabaseSync } = load('node:sqlite') as {
    DatabaseSync: new (filename: string) => NodeSqliteDatabase;
  };
  const database = new DatabaseSync(filename);
  database.exec(`PRAGMA busy_timeout = ${busyTimeoutMs}`);
  return database;
}
