import { ConfigError } from '../../core/contract/index.js';

/**
 * A SQL store's table (or a column of this release) does not exist, and the store may not create
 * it (no `migrate: true`): made by `store.migrate()`, `retrysafe migrate` or the SQL of
 * `retrysafe migrate --print`. A ConfigError, so a caller that must tell it apart (the CLI) can.
 */
export class TableMissingError extends ConfigError {}

export function isTableMissing(error: unknown): error is TableMissingError {
  return error instanceof TableMissingError;
}
