import type { Pool, PoolConnection, QueryResult, QueryValues } from 'mysql2/promise';
import { RetrysafeError } from '../../core/contract/index.js';
import { timerMs } from '../../core/options/index.js';
import { databaseErrorCode, type SqlDriver, type SqlResult } from '../sql/driver.js';

/** mysql2's code for a statement past its `timeout`. */
const QUERY_TIMEOUT = 'PROTOCOL_SEQUENCE_TIMEOUT';

/** A mysql2 result as the SQL store reads it: a SELECT's rows, or a write's count and insert id. */
function resultOf<Row>(result: QueryResult): SqlResult<Row> {
  if (Array.isArray(result)) return { rows: result as Row[], affected: 0 };
  const header = result as { affectedRows: number; insertId: number };
  return { rows: [], affected: header.affectedRows, insertId: header.insertId };
}

/**
 * A pool connection, or a rejection once `timeoutMs` has passed: mysql2's pool queues callers
 * without a bound. A connection that comes after that goes straight back.
 */
function connectionWithin(pool: Pool, timeoutMs: number): Promise<PoolConnection> {
  const connecting = pool.getConnection();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      connecting.then((connection) => connection.release()).catch(() => {});
      reject(new RetrysafeError(`mysqlStore: no pool connection within ${timeoutMs} ms`));
    }, timerMs(timeoutMs));
  });
  return Promise.race([connecting, timedOut]).finally(() => clearTimeout(timer));
}

/**
 * The SQL driver over a `mysql2/promise` pool: statements run on the pool in autocommit, and an
 * operation's transaction on a connection of it, which the handler gets as `ctx.tx`. Writes
 * report their insert id, which spares a claim that inserted its row the read back.
 */
export function mysql2Driver(pool: Pool): SqlDriver<PoolConnection> {
  /** Connections a bounded statement timed out on, with its error. */
  const timedOut = new WeakMap<PoolConnection, unknown>();
  return {
    dialect: 'mysql',
    name: 'mysql',
    async query(sql, params) {
      const [result] = await pool.query(sql, params as unknown[] as QueryValues);
      return resultOf(result);
    },
    async queryIn(connection, sql, params, bound) {
      const discarded = timedOut.get(connection);
      if (discarded) throw discarded;
      try {
        const [result] = await connection.query(
          { sql, timeout: bound?.timeoutMs },
          params as unknown[] as QueryValues,
        );
        return resultOf(result);
      } catch (error) {
        // The statement may still run on the server, and its answer would come to whatever the
        // connection sends next: nothing more goes on it, and it is destroyed, not released.
        if ((error as { code?: unknown }).code === QUERY_TIMEOUT) timedOut.set(connection, error);
        throw error;
      }
    },
    async transaction(work, options) {
      const { acquireTimeoutMs } = options ?? {};
      const connection = await (acquireTimeoutMs === undefined
        ? pool.getConnection()
        : connectionWithin(pool, acquireTimeoutMs));
      // A connection whose statement timed out or whose rollback failed cannot be trusted with
      // another transaction: it goes.
      let broken = false;
      try {
        await connection.beginTransaction();
        const result = await work(connection);
        await connection.commit();
        return result;
      } catch (error) {
        broken = timedOut.has(connection);
        if (!broken) {
          await connection.rollback().catch(() => {
            broken = true;
          });
        }
        throw error;
      } finally {
        if (broken) connection.destroy();
        else connection.release();
      }
    },
    errorCode: databaseErrorCode,
  };
}
