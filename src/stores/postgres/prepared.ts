import pg from 'pg';
import { timerMs } from '../../core/options/index.js';

const DUPLICATE_PREPARED_STATEMENT = '42P05';
/**
 * The SQL-level prepared statements each connection holds, shared by every store in the process
 * (two stores of one table on one pool would otherwise prepare the same name twice).
 */
export const preparedOn = new WeakMap<pg.ClientBase, Set<string>>();

export interface Statement {
  name: string;
  text: string;
}

/** A statement run inside a multi-statement simple query: the SQL types of its `$n`, in order. */
export interface TypedStatement extends Statement {
  types: readonly string[];
}

export type SqlValue = string | number | Buffer;

export function literal(value: SqlValue): string {
  return pg.escapeLiteral(Buffer.isBuffer(value) ? `\\x${value.toString('hex')}` : String(value));
}

/**
 * `statement` with `values`, as one statement of a multi-statement simple query (which takes no
 * parameters): `EXECUTE` of the prepared statement, or, where nothing may be prepared (a
 * transaction pooler), its text with each `$n` replaced by a literal of its type.
 */
export function withValues(
  statement: TypedStatement,
  values: readonly SqlValue[],
  prepared: boolean,
): string {
  if (prepared) return `EXECUTE ${statement.name}(${values.map(literal).join(', ')})`;
  return statement.text.replace(/\$(\d+)/g, (_, n: string) => {
    const index = Number(n) - 1;
    return `${literal(values[index]!)}::${statement.types[index]}`;
  });
}

/** Whether every one of `statements` is prepared on `client` already (no turn spent asking). */
export function preparedAll(client: pg.PoolClient, statements: readonly Statement[]): boolean {
  const names = preparedOn.get(client);
  if (names === undefined) return false;
  for (const { name } of statements) if (!names.has(name)) return false;
  return true;
}

/**
 * Prepares `statements` on `client` with SQL `PREPARE`, once per connection, so `EXECUTE` can run
 * them. Preparing waits on a lock of the table like the statement itself would, so it is bounded
 * by `timeoutMs` (the SETs share the query's implicit transaction: a timeout undoes them too).
 */
export async function prepare(
  client: pg.PoolClient,
  statements: readonly Statement[],
  timeoutMs: number,
): Promise<void> {
  const names = preparedOn.get(client) ?? new Set<string>();
  preparedOn.set(client, names);
  for (const { name, text } of statements) {
    if (names.has(name)) continue;
    try {
      await client.query(
        `SET statement_timeout = ${timerMs(timeoutMs)}; PREPARE ${name} AS ${text}; SET statement_timeout TO DEFAULT`,
      );
    } catch (error) {
      // Another copy of this module (one per package format, say) prepared it on this connection.
      if ((error as { code?: string }).code !== DUPLICATE_PREPARED_STATEMENT) throw error;
    }
    names.add(name);
  }
}
