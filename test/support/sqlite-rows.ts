import Database from 'better-sqlite3';

/** The rows `sql` (with `params`) reads from the SQLite file `filename`, on a read-only connection of its own. */
export function sqliteRows<Row>(filename: string, sql: string, ...params: unknown[]): Row[] {
  const db = new Database(filename, { readonly: true });
  try {
    return db.prepare(sql).all(...params) as Row[];
  } finally {
    db.close();
  }
}
