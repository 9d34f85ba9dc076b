import { sqlIdentifier } from '../internal.js';

export const tableName = (value: unknown) => sqlIdentifier('sqliteStore', 'table', value);

/**
 * The statements that create the store's table (each safe to run again; `store.migrate()` runs them), for a
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
    `CREATE INDEX IF NOT EXISTS "${table}_abandoned" ON "${table}" (lease_until_ms) WHERE request IS NOT NULL AND completed_at_ms IS NULL`,
  ];
}

/** The step columns, added to a table created before steps existed. */
const STEP_COLUMNS = ['steps', 'request'] as const;

/** The columns of `table`, as rows with a `name` (for {@link stepColumnsSql}). */
export const tableColumnsSql = (table: string) => `SELECT name FROM pragma_table_info('${table}')`;

/** `ALTER TABLE` for the step columns a table made by an older release lacks (`columns`, what {@link tableColumnsSql} read). */
export function stepColumnsSql(table: string, columns: readonly { name: string }[]): string[] {
  const have = new Set(columns.map((column) => column.name));
  return STEP_COLUMNS.filter((column) => !have.has(column)).map(
    (column) => `ALTER TABLE "${table}" ADD COLUMN ${column} TEXT`,
  );
}
