import { sqlIdentifier } from '../internal.js';

export const identifier = (name: string, value: string) => sqlIdentifier('mysqlStore', name, value, 64);

/**
 * The statements `migrate()` runs, in order, on one connection, for a migration tool of your own
 * (`retrysafe migrate --print`). Each is safe to run again. Scope and key are byte strings,
 * compared and ordered byte for byte: the server's default collations would make `Key` and `key `
 * (trailing space) one operation. The last four add the step columns and their index to a table
 * made by an older release (MySQL has no `ADD COLUMN IF NOT EXISTS`, so the `ALTER TABLE` is
 * prepared only when `information_schema` lacks the `steps` column).
 * @example
 * ```ts
 * import { mysqlMigrationSql } from 'retrysafe/mysql';
 * await fs.writeFile('migrations/0001_idempotency.sql', mysqlMigrationSql().join(';\n') + ';\n');
 * ```
 */
export function mysqlMigrationSql(options: { table?: string } = {}): string[] {
  const table = identifier('table', options.table ?? 'idempotency_keys');
  return [
    `CREATE TABLE IF NOT EXISTS \`${table}\` (
  scope varbinary(1024) NOT NULL,
  \`key\` varbinary(1024) NOT NULL,
  fingerprint varchar(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  token char(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  lease_until_ms bigint NOT NULL,
  created_at_ms bigint NOT NULL,
  expires_at_ms bigint NOT NULL,
  completed_at_ms bigint NULL,
  status int NULL,
  headers longtext NULL,
  body longblob NULL,
  steps longtext CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  request longtext CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  PRIMARY KEY (scope, \`key\`),
  INDEX \`${table}_expires_at_ms\` (expires_at_ms),
  INDEX \`${table}_abandoned\` (completed_at_ms, lease_until_ms)
) ENGINE=InnoDB`,
    // Steps came in a later release: a table made before lacks their columns and index.
    `SET @retrysafe_migrate = IF(
  (SELECT COUNT(*) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '${table}' AND COLUMN_NAME = 'steps') = 0,
  'ALTER TABLE \`${table}\`
    ADD COLUMN steps longtext CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD COLUMN request longtext CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD INDEX \`${table}_abandoned\` (completed_at_ms, lease_until_ms)',
  'DO 0')`,
    'PREPARE retrysafe_migrate FROM @retrysafe_migrate',
    'EXECUTE retrysafe_migrate',
    'DEALLOCATE PREPARE retrysafe_migrate',
  ];
}
