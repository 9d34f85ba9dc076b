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
