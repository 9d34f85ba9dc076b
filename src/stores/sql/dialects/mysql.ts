import { randomUUID } from 'node:crypto';
import type { ClaimInput, ClaimResult, StoredResponse } from '../../../core/store.js';
import { BLOCKED_RETRY_AFTER_MS } from '../../in-flight.js';
import { toBuffer } from '../../internal.js';
import { identifier, mysqlMigrationSql } from '../../mysql/migrate.js';
import { claimOfRecord, claimValues, type RecordRow, statements } from '../../mysql/statements.js';
import type { Run, Statement, StoreDialect } from '../dialect.js';
import type { SqlDriver, StatementBound } from '../driver.js';
import { positional } from '../placeholders.js';

const ER_NO_SUCH_TABLE = 'ER_NO_SUCH_TABLE';
/** A table made before steps existed: the migration adds their columns. */
const ER_BAD_FIELD_ERROR = 'ER_BAD_FIELD_ERROR';
const ER_LOCK_WAIT_TIMEOUT = 'ER_LOCK_WAIT_TIMEOUT';
const ER_LOCK_DEADLOCK = 'ER_LOCK_DEADLOCK';
const ER_UNKNOWN_SYSTEM_VARIABLE = 'ER_UNKNOWN_SYSTEM_VARIABLE';
/** Concurrent inserts of one new key can deadlock on its gap lock (InnoDB picks a victim): ask again. */
const CLAIM_ATTEMPTS = 4;

/** A statement of the `mysql` store (`:name` placeholders) as the driver takes it (`?`). */
function named(text: string, values: Readonly<Record<string, unknown>>): Statement {
  const statement = positional(text, values);
  return { text: statement.text, values: statement.params };
}

/**
 * The MySQL/MariaDB dialect of the SQL store: the `mysql` store's statements
 * (mysql/statements.ts) over a driver. A claim is its `INSERT … ON DUPLICATE KEY UPDATE`, then,
 * unless the driver's insert id says it inserted the row, the record read back: our token there
 * means acquired.
 */
export function mysqlDialect(
  driver: Pick<SqlDriver<unknown>, 'errorCode'>,
  options: { table?: string },
): StoreDialect {
  const table = identifier('table', options.table ?? 'idempotency_keys');
  const sql = statements(`\`${table}\``);
  /** Until the server says it has no @@in_transaction (MySQL), completions in atomic mode check it. */
  let guardedCompletion = true;

  /** One round of a claim: the claim, then the row it met; `undefined` when that row changed between. */
  async function claimOnce(
    run: Run,
    input: ClaimInput,
    bound?: StatementBound,
  ): Promise<ClaimResult | undefined> {
    const token = randomUUID();
    const values = claimValues(input, token);
    const claim = named(sql.CLAIM, values);
    // LAST_INSERT_ID 0: the claim inserted the row, ours (statements.ts); a driver that reports
    // none has the row read back.
    if ((await run(claim.text, claim.values, bound)).insertId === 0) return { outcome: 'acquired', token };
    const record = named(sql.RECORD, values);
    return claimOfRecord((await run<RecordRow>(record.text, record.values, bound)).rows[0], token, input);
  }

  const completeValues = (scope: string, key: string, token: string, response: StoredResponse) => ({
    scope,
    key,
    token,
    status: response.status,
    headers: JSON.stringify(response.headers),
    body: toBuffer(response.body),
  });

  return {
    qualified: `\`${table}\``,
    migrateHint: `\`retrysafe migrate --database-url <mysql://…> --table ${table}\``,
    missing: (code) => code === ER_NO_SUCH_TABLE || code === ER_BAD_FIELD_ERROR,
    async migrate(run) {
      // The statements share a session (a user variable, a prepared statement); the caller runs
      // them on one connection, outside any operation's transaction, which DDL would commit.
      for (const statement of mysqlMigrationSql({ table })) await run(statement);
    },
    async claim(run, input) {
      for (let attempt = 1; attempt <= CLAIM_ATTEMPTS; attempt++) {
        try {
          const result = await claimOnce(run, input);
          if (result) return result;
        } catch (error) {
          if (driver.errorCode(error) !== ER_LOCK_DEADLOCK) throw error;
        }
      }
      return { outcome: 'in_progress', retryAfterMs: 0 };
    },
    async boundedClaim(run, input, waitMs, timeoutMs) {
      // InnoDB bounds a row-lock wait (a duplicate's) in whole seconds only, set for the session
      // around the claim; no session bound of MySQL's covers every other statement (a table lock,
      // a server that stopped answering), so `timeoutMs` bounds the claim client side, where the
      // driver can.
      const seconds = Math.max(1, Math.ceil(waitMs / 1000));
      const bound = named(sql.BOUND_LOCK_WAIT, { seconds });
      await run(bound.text, bound.values);
      try {
        return await claimOnce(run, input, { timeoutMs: timeoutMs + seconds * 1000 });
      } catch (error) {
        const code = driver.errorCode(error);
        // The wait timed out: only the statement rolled back; the store rolls back the rest.
        if (code === ER_LOCK_WAIT_TIMEOUT)
          return { outcome: 'in_progress', retryAfterMs: BLOCKED_RETRY_AFTER_MS };
        // The server rolled the whole transaction back: the store starts another.
        if (code === ER_LOCK_DEADLOCK) return undefined;
        throw error;
      } finally {
        await run(sql.UNBOUND_LOCK_WAIT);
      }
    },
    async atomicComplete(run, scope, key, token, response) {
      const values = completeValues(scope, key, token, response);
      let saved: number | undefined;
      if (guardedCompletion) {
        try {
          const statement = named(sql.ATOMIC_COMPLETE, values);
          saved = (await run(statement.text, statement.values)).affected;
        } catch (error) {
          // A failed statement does not end a MySQL transaction: the plain completion runs in it.
          if (driver.errorCode(error) !== ER_UNKNOWN_SYSTEM_VARIABLE) throw error;
          guardedCompletion = false;
        }
      }
      if (saved === undefined) {
        const statement = named(sql.COMPLETE, values);
        saved = (await run(statement.text, statement.values)).affected;
      }
      return saved === 1 ? undefined : { cause: undefined };
    },
    async ended(run) {
      // MariaDB's @@in_transaction is 0 once the handler committed; MySQL lacks it: unsure, false.
      try {
        const { rows } = await run<{ open: unknown }>(sql.ENDED);
        return Number(rows[0]?.open) === 0;
      } catch {
        return false;
      }
    },
    complete: (scope, key, token, response) =>
      named(sql.COMPLETE, completeValues(scope, key, token, response)),
    release: (scope, key, token) => named(sql.RELEASE, { scope, key, token }),
    saveStep: (scope, key, token, step, request) =>
      named(sql.SAVE_STEP, {
        scope,
        key,
        token,
        step: JSON.stringify({ name: step.name, value: step.value }),
        request,
      }),
    lockOwned: (scope, key) => named(sql.LOCK_OWNED, { scope, key }),
    abandoned: (limit) => named(sql.ABANDONED, { limit }),
    renew: (scope, key, token, leaseMs) => named(sql.RENEW, { scope, key, token, leaseMs }),
    leaseLeft: (scope, key) => named(sql.LEASE_LEFT, { scope, key }),
    purge: (batchSize) => named(sql.PURGE, { batchSize }),
    list(limit, page) {
      const { text, values } = sql.list(limit, page);
      return named(text, values);
    },
    get: (scope, key, response) => named(response ? sql.GET_WITH_RESPONSE : sql.GET, { scope, key }),
    delete: (scope, key) => named(sql.DELETE, { scope, key }),
  };
}
