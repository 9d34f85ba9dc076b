import { sqlIdentifier } from '../internal.js';
import type { Driver } from './driver.js';

export const tableName = (value: unknown) => sqlIdentifier('sqliteStore', 'table', value);

/**
 * The statements the store runs when it opens the database (each safe to run again), for a
 * migration tool of your own (`retrysafe migrate --print`).
 */
export function sqliteMigrationSql(options: { table?: string } = {}): string[] {
  const table = tableName(options.table ?? 'idempotency_keys');
  return [
    `CREATE TABLE IF NOT EXISTS "${table}" (
  scope TEXT NOT NULL,
  key TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  token TEXT NOT NULL,
  lease_until_ms INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  completed_at_ms INTEGER,
  status INTEGER,
  headers TEXT,
  body BLOB,
  steps TEXT,
  request TEXT,
  PRIMARY KEY (scope, key))`,
    `CREATE INDEX IF NOT EXISTS "${table}_expires_at_ms" ON "${table}" (expires_at_ms)`,
  ];
}

/** The step columns, added to a table created before steps existed. */
const STEP_COLUMNS = ['steps', 'request'] as const;

/** The columns of `table`, as rows with a `name` (for {@link stepColumnsSql}). */
export const tableColumnsSql = (table: string) => `SELECT name FROM pragma_table_info('${table}')`;

/**
 * `ALTER TABLE` for the step columns a table made by an older release lacks (`columns`, what
 * {@link tableColumnsSql} read), and the index over them.
 */
export function stepColumnsSql(table: string, columns: readonly { name: string }[]): string[] {
  const have = new Set(columns.map((column) => column.name));
  return [
    ...STEP_COLUMNS.filter((column) => !have.has(column)).map(
      (column) => `ALTER TABLE "${table}" ADD COLUMN ${column} TEXT`,
    ),
    `CREATE INDEX IF NOT EXISTS "${table}_abandoned" ON "${table}" (lease_until_ms) WHERE request IS NOT NULL AND completed_at_ms IS NULL`,
  ];
}

/** `ALTER TABLE` for the step columns a table made by an older release lacks. */
export function addStepColumns(db: Driver, table: string): void {
  const columns = db.prepare(tableColumnsSql(table)).all() as { name: string }[];
  for (const statement of stepColumnsSql(table, columns)) db.exec(statement);
}
