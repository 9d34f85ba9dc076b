import { sqlIdentifier } from '../internal.js';

export const identifier = (name: string, value: string) => sqlIdentifier('postgresStore', name, value);

/**
 * The statements `migrate()` runs, in order, for a migration tool of your own
 * (`retrysafe migrate --print`). Each is safe to run again.
 * @example
 * ```ts
 * import { postgresMigrationSql } from 'retrysafe/postgres';
 * await fs.writeFile('migrations/0001_idempotency.sql', postgresMigrationSql({ schema: 'app' }).join(';\n') + ';\n');
 * ```
 */
export function postgresMigrationSql(options: { schema?: string; table?: string } = {}): string[] {
  const schema = identifier('schema', options.schema ?? 'public');
  const table = identifier('table', options.table ?? 'idempotency_keys');
  const qualified = `"${schema}"."${table}"`;
  return [
    // Every database has `public`, and creating it would need a privilege the user may lack.
    ...(schema === 'public' ? [] : [`CREATE SCHEMA IF NOT EXISTS "${schema}"`]),
    `CREATE TABLE IF NOT EXISTS ${qualified} (
  scope text NOT NULL,
  key text NOT NULL,
  fingerprint text NOT NULL,
  token text NOT NULL,
  lease_until_ms bigint NOT NULL,
  created_at_ms bigint NOT NULL,
  expires_at_ms bigint NOT NULL,
  completed_at_ms bigint,
  status integer,
  headers json,
  body bytea,
  steps jsonb,
  request text,
  PRIMARY KEY (scope, key))`,
    `CREATE INDEX IF NOT EXISTS "${table}_expires_at_ms" ON ${qualified} (expires_at_ms)`,
    // Steps came in a later release: a table made before lacks their columns.
    `ALTER TABLE ${qualified} ADD COLUMN IF NOT EXISTS steps jsonb, ADD COLUMN IF NOT EXISTS request text`,
    `CREATE INDEX IF NOT EXISTS "${table}_abandoned" ON ${qualified} (lease_until_ms)
  WHERE request IS NOT NULL AND completed_at_ms IS NULL`,
  ];
}

/**
 * Runs the migration's statements through `query`, inside a transaction its caller opened (a `pg`
 * client, an ORM's transaction): an advisory lock first, since two app servers migrating at once
 * would otherwise race on CREATE … IF NOT EXISTS.
 */
export async function migrateIn(
  query: (text: string, values?: unknown[]) => Promise<{ rows: unknown[] }>,
  schema: string,
  table: string,
): Promise<void> {
  // No `void` column in the answer: some drivers (Prisma) cannot decode one.
  await query('SELECT 1 AS locked FROM pg_advisory_xact_lock(hashtext($1))', [
    `retrysafe_migrate_"${schema}"."${table}"`,
  ]);
  // CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege even when the schema exists.
  const { rows } = await query('SELECT 1 AS found FROM pg_namespace WHERE nspname = $1', [schema]);
  for (const statement of postgresMigrationSql({ schema, table })) {
    if (rows.length === 0 || !statement.startsWith('CREATE SCHEMA')) await query(statement);
  }
}
