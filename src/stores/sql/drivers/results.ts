import type { SqlResult } from '../driver.js';

/**
 * mysql2 answers `[rows, fields]`: the rows of a SELECT, or a `ResultSetHeader`. Its
 * `affectedRows` counts the rows a write matched only when the connection asked for found rows
 * (mysql2's default; Sequelize turns it off); an UPDATE's `info` ("Rows matched: 1  Changed: 0")
 * says how many it matched either way, which is what the store's fencing counts.
 */
export function mysqlResultOf<Row>(result: unknown): SqlResult<Row> {
  const [first] = result as [Row[] | { affectedRows?: number; info?: string }];
  if (Array.isArray(first)) return { rows: first, affected: 0 };
  const matched = /^Rows matched: (\d+)/.exec(first.info ?? '')?.[1];
  return { rows: [], affected: Number(matched ?? first.affectedRows ?? 0) };
}

/** node-postgres answers a `QueryResult` (whose `rowCount` counts a SELECT's rows too), postgres.js an array with a `count`. */
export function pgResultOf<Row>(result: unknown): SqlResult<Row> {
  if (Array.isArray(result)) {
    const { count, command } = result as { count?: number; command?: string };
    return { rows: result as Row[], affected: command === 'SELECT' ? 0 : Number(count ?? 0) };
  }
  const { rows, rowCount, command } = result as { rows: Row[]; rowCount: number | null; command?: string };
  return { rows, affected: command === 'SELECT' ? 0 : (rowCount ?? 0) };
}
