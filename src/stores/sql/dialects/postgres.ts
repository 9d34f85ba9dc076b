import { createHash } from 'node:crypto';
import type { ClaimInput, StoredResponse } from '../../../core/store.js';
import { BLOCKED_RETRY_AFTER_MS } from '../../in-flight.js';
import { toBuffer } from '../../internal.js';
import { identifier, migrateIn } from '../../postgres/migrate.js';
import { claimRecord, postgresStatements } from '../../postgres/statements.js';
import type { Run, StoreDialect } from '../dialect.js';
import type { SqlDriver } from '../driver.js';

const LOCK_NOT_AVAILABLE = '55P03';
const UNDEFINED_TABLE = '42P01';
const UNDEFINED_COLUMN = '42703';
const INVALID_SCHEMA_NAME = '3F000';
const DIVISION_BY_ZERO = '22012';
/** The longest `statement_timeout` PostgreSQL takes (an int of ms): a 30-day wait plus a bound is past it. */
const MAX_TIMEOUT_MS = 2_147_483_647;
const statementBound = (ms: number) => Math.min(ms, MAX_TIMEOUT_MS);

/**
 * The PostgreSQL dialect of the SQL store: the statements of postgres/statements.ts, whose
 * changes notify on the table's channel, so a store whose driver listens (`pg`) wakes its waiters
 * on any store's changes, an ORM's included.
 */
export function postgresDialect(
  driver: Pick<SqlDriver<unknown>, 'errorCode' | 'query' | 'pipelineIn'>,
  options: { schema?: string; table?: string },
): StoreDialect {
  const schema = identifier('schema', options.schema ?? 'public');
  const table = identifier('table', options.table ?? 'idempotency_keys');
  const qualified = `"${schema}"."${table}"`;
  const sql = postgresStatements(qualified);
  const channel = `retrysafe_${createHash('sha1').update(qualified).digest('hex').slice(0, 12)}`;
  const notifyId = (scope: string, key: string) =>
    createHash('sha1').update(scope).update('\0').update(key).digest('base64');
  const completeValues = (scope: string, key: string, token: string, response: StoredResponse) => [
    scope,
    key,
    token,
    response.status,
    JSON.stringify(response.headers),
    toBuffer(response.body),
  ];

  /** The session's lock and statement timeouts, which a bounded claim sets back; read once. */
  let resets: Promise<string[]> | undefined;
  let reset: string[] | undefined;

  /**
   * The claim over a driver that pipelines (`pg`), as one round trip: the first also opens the
   * transaction and takes the table's lock under `timeoutMs` alone, so that a locked table is never
   * mistaken for a duplicate; then the claim under its two bounds (a duplicate blocks on the
   * primary key for `waitMs`, then lock_timeout says in_progress), set back before the handler's
   * statements. Its statements run prepared where the driver prepares (once per connection).
   */
  async function pipelinedClaim(run: Run, input: ClaimInput, waitMs: number, timeoutMs: number) {
    const pipeline = run.pipeline!;
    const bothMs = statementBound(waitMs + timeoutMs);
    await run.prepare?.([sql.CLAIM, sql.TAKE_OVER, sql.ATOMIC_COMPLETE], timeoutMs);
    let first = true;
    return claimRecord(async (take, values) => {
      const statements = [
        ...(first
          ? [
              'SET LOCAL lock_timeout = 0',
              `SET LOCAL statement_timeout = ${timeoutMs}`,
              `LOCK TABLE ${qualified} IN ROW EXCLUSIVE MODE`,
            ]
          : []),
        `SET LOCAL lock_timeout = ${waitMs}`,
        `SET LOCAL statement_timeout = ${bothMs}`,
        { text: take ? sql.TAKE_OVER : sql.CLAIM, values },
        'SET LOCAL lock_timeout TO DEFAULT',
        'SET LOCAL statement_timeout TO DEFAULT',
      ].map((statement) => (typeof statement === 'string' ? { text: statement } : statement));
      first = false;
      const results = await pipeline(statements, bothMs);
      return results[results.length - 3]!;
    }, input);
  }

  return {
    channel,
    async beforeAtomic() {
      if (driver.pipelineIn) return;
      resets ??= driver.query<{ name: string; reset_val: string }>(sql.SESSION_TIMEOUTS, []).then(
        ({ rows }) =>
          ['lock_timeout', 'statement_timeout'].map(
            (name) => rows.find((row) => row.name === name)!.reset_val,
          ),
        (error: unknown) => {
          resets = undefined;
          throw error;
        },
      );
      reset = await resets;
    },
    qualified,
    migrateHint: `\`retrysafe migrate --database-url <url> --schema ${schema} --table ${table}\``,
    missing: (code) => code === UNDEFINED_TABLE || code === INVALID_SCHEMA_NAME || code === UNDEFINED_COLUMN,
    migrate: (run) => migrateIn((text, values = []) => run(text, values), schema, table),
    claim: (run, input) =>
      claimRecord((take, values) => run(take ? sql.TAKE_OVER : sql.CLAIM, values), input),
    async boundedClaim(run, input, waitMs, timeoutMs) {
      // The claim's own statement sets its lock and statement timeouts and sets them back to the
      // session's (read by beforeAtomic, which the store runs first).
      try {
        if (run.pipeline) return await pipelinedClaim(run, input, waitMs, timeoutMs);
        if (!reset) throw new Error('postgresDialect: boundedClaim before beforeAtomic');
        const bounds = [String(waitMs), String(statementBound(waitMs + timeoutMs)), ...reset];
        return await claimRecord(
          (take, values) => run(take ? sql.BOUNDED_TAKE_OVER : sql.BOUNDED_CLAIM, [...values, ...bounds]),
          input,
        );
      } catch (error) {
        // lock_timeout: a duplicate's transaction held the key for all of `waitMs`.
        if (driver.errorCode(error) !== LOCK_NOT_AVAILABLE) throw error;
        return { outcome: 'in_progress', retryAfterMs: BLOCKED_RETRY_AFTER_MS };
      }
    },
    async atomicComplete(run, scope, key, token, response) {
      try {
        await run(sql.ATOMIC_COMPLETE, completeValues(scope, key, token, response));
        return undefined;
      } catch (error) {
        if (driver.errorCode(error) !== DIVISION_BY_ZERO) throw error;
        return { cause: error };
      }
    },
    async ended(run) {
      // A transaction that is only aborted (a failed statement of the handler's) fails the check.
      try {
        const { rows } = await run<{ ended: boolean }>(sql.ENDED);
        return rows[0]?.ended === true;
      } catch {
        return false;
      }
    },
    complete: (scope, key, token, response) => ({
      text: sql.COMPLETE,
      values: [...completeValues(scope, key, token, response), channel, notifyId(scope, key)],
    }),
    release: (scope, key, token) => ({
      text: sql.RELEASE,
      values: [scope, key, token, channel, notifyId(scope, key)],
    }),
    saveStep: (scope, key, token, step, request) => ({
      text: sql.SAVE_STEP,
      values: [scope, key, token, step.name, step.value, request],
    }),
    lockOwned: (scope, key) => ({ text: sql.LOCK_OWNED, values: [scope, key] }),
    abandoned: (limit) => ({ text: sql.ABANDONED, values: [limit] }),
    renew: (scope, key, token, leaseMs) => ({ text: sql.RENEW, values: [scope, key, token, leaseMs] }),
    leaseLeft: (scope, key) => ({ text: sql.LEASE_LEFT, values: [scope, key] }),
    purge: (batchSize) => ({ text: sql.PURGE, values: [batchSize] }),
    list: (limit, page) => sql.list(limit, page),
    get: (scope, key, response) => ({
      text: response ? sql.GET_WITH_RESPONSE : sql.GET,
      values: [scope, key],
    }),
    delete: (scope, key) => ({ text: sql.DELETE, values: [scope, key, channel, notifyId(scope, key)] }),
  };
}
