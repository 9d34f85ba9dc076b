import type { ClaimInput, ClaimResult, StoredResponse } from '../../../core/store.js';
import { newToken } from '../../internal.js';
import { sqliteMigrationSql, stepColumnsSql, tableColumnsSql, tableName } from '../../sqlite/migrate.js';
import {
  acquiredOf,
  claimable,
  claimParameters,
  completedOf,
  listParameters,
  listShape,
  type RecordRow,
  settledOf,
  sqliteStatements,
} from '../../sqlite/statements.js';
import type { Run, StoreDialect } from '../dialect.js';
import type { SqlDriver } from '../driver.js';

/**
 * Outside a transaction a claim's insert and its read of the row it met are two statements: one
 * that finds the row changed in between (deleted, or claimable again) asks again.
 */
const CLAIM_ATTEMPTS = 4;

/**
 * Opened right after an atomic claim, inside the operation's transaction, and released before its
 * answer is saved: a handler that ended the transaction (a raw `COMMIT` or `ROLLBACK`, even one
 * followed by a `BEGIN` of its own) took the savepoint with it, so releasing it fails. SQLite has
 * no transaction id to compare, and the connection's autocommit flag would miss that second BEGIN.
 */
const CLAIM_SAVEPOINT = 'retrysafe_atomic_claim';

/**
 * The SQLite dialect of the SQL store: the `sqlite` store's statements (sqlite/statements.ts) over
 * a driver whose transactions are `BEGIN IMMEDIATE` (they hold the write lock from the claim to the
 * commit, so a duplicate in another connection waits on the lock, then replays). Records are
 * stamped by the driver's clock (`now`, else `Date.now`): SQLite runs in this process.
 */
export function sqliteDialect(
  driver: Pick<SqlDriver<unknown>, 'now'>,
  options: { table?: string },
): StoreDialect {
  const table = tableName(options.table ?? 'idempotency_keys');
  const sql = sqliteStatements(`"${table}"`);
  const now = driver.now ?? Date.now;

  async function record(run: Run, input: ClaimInput): Promise<RecordRow | undefined> {
    return (await run<RecordRow>(sql.RECORD, [input.scope, input.key])).rows[0];
  }

  /** One round of a claim: the insert, else the row it met; `undefined` when that row changed between. */
  async function claimOnce(run: Run, input: ClaimInput): Promise<ClaimResult | undefined> {
    const nowMs = now();
    const token = newToken();
    const { rows } = await run<{ token: string; steps: string | null }>(
      sql.CLAIM,
      claimParameters(input, token, nowMs),
    );
    const acquired = acquiredOf(rows[0], token);
    if (acquired) return acquired;
    const row = await record(run, input);
    return row && !claimable(row, input, now()) ? settledOf(row, input, nowMs) : undefined;
  }

  const completeValues = (scope: string, key: string, token: string, response: StoredResponse) => {
    const nowMs = now();
    return [
      nowMs,
      response.status,
      JSON.stringify(response.headers),
      response.body,
      scope,
      key,
      token,
      nowMs,
    ];
  };

  /** Whether the claim's savepoint is gone with the transaction; releases it when it is not. */
  async function released(run: Run): Promise<{ cause: unknown } | undefined> {
    try {
      await run(`RELEASE ${CLAIM_SAVEPOINT}`);
      return undefined;
    } catch (error) {
      if (!/no such savepoint/i.test(messagesOf(error))) throw error;
      return { cause: error };
    }
  }

  return {
    qualified: `"${table}"`,
    migrateHint: `\`retrysafe migrate --database-url <file> --table ${table}\``,
    missing: (code, error) => code === 'SQLITE_ERROR' && /no such (table|column)/i.test(messagesOf(error)),
    async migrate(run) {
      // A table made before steps existed gets their columns before the indexes over them.
      const [create, ...indexes] = sqliteMigrationSql({ table });
      await run(create!);
      const { rows } = await run<{ name: string }>(tableColumnsSql(table));
      for (const statement of [...stepColumnsSql(table, rows), ...indexes]) await run(statement);
    },
    async claim(run, input) {
      const completed = completedOf(await record(run, input), input, now());
      if (completed) return completed;
      for (let attempt = 1; attempt <= CLAIM_ATTEMPTS; attempt++) {
        const result = await claimOnce(run, input);
        if (result) return result;
      }
      return { outcome: 'in_progress', retryAfterMs: 0 };
    },
    async settled(run, input) {
      return completedOf(await record(run, input), input, now());
    },
    async boundedClaim(run, input) {
      // The transaction holds the write lock (`BEGIN IMMEDIATE`; a duplicate waited for it there,
      // within the driver's busy timeout): the claim's insert and read see one state and never wait.
      const result = await claimOnce(run, input);
      if (result?.outcome === 'acquired') await run(`SAVEPOINT ${CLAIM_SAVEPOINT}`);
      return result;
    },
    async atomicComplete(run, scope, key, token, response) {
      const ended = await released(run);
      if (ended) return ended;
      const { affected } = await run(sql.COMPLETE, completeValues(scope, key, token, response));
      if (affected === 1) return undefined;
      // The record expired while the work ran: `ended` must still find the transaction open.
      await run(`SAVEPOINT ${CLAIM_SAVEPOINT}`);
      return { cause: undefined };
    },
    async ended(run) {
      try {
        if (await released(run)) return true;
        await run(`SAVEPOINT ${CLAIM_SAVEPOINT}`);
        return false;
      } catch {
        return false;
      }
    },
    complete: (scope, key, token, response) => ({
      text: sql.COMPLETE,
      values: completeValues(scope, key, token, response),
    }),
    release: (scope, key, token) => ({ text: sql.RELEASE, values: [scope, key, token, now()] }),
    saveStep: (scope, key, token, step, request) => ({
      text: sql.SAVE_STEP,
      values: [step.name, step.value, request, scope, key, token, now()],
    }),
    lockOwned: (scope, key) => ({ text: sql.OWNER, values: [scope, key, now()] }),
    abandoned(limit) {
      const nowMs = now();
      return { text: sql.ABANDONED, values: [nowMs, nowMs, limit] };
    },
    renew(scope, key, token, leaseMs) {
      const nowMs = now();
      return { text: sql.RENEW, values: [nowMs + leaseMs, nowMs + leaseMs, scope, key, token, nowMs] };
    },
    leaseLeft(scope, key) {
      const nowMs = now();
      return { text: sql.LEASE_LEFT, values: [nowMs, scope, key, nowMs, nowMs] };
    },
    purge: (batchSize) => ({ text: sql.PURGE, values: [now(), batchSize] }),
    list(limit, { scope, after }) {
      const shape = listShape(scope, after);
      return {
        text: sql.list(scope !== undefined, shape),
        values: listParameters(now(), limit, scope, shape, after),
      };
    },
    get: (scope, key, response) => ({
      text: response ? sql.GET_WITH_RESPONSE : sql.GET,
      values: [scope, key, now()],
    }),
    delete: (scope, key) => ({ text: sql.DELETE, values: [scope, key, now()] }),
  };
}

/** Every message on `error` and its causes (an ORM may wrap SQLite's error). */
function messagesOf(error: unknown): string {
  const messages: string[] = [];
  const seen = new Set<unknown>();
  for (let current = error; current instanceof Error && !seen.has(current); current = current.cause) {
    seen.add(current);
    messages.push(current.message);
  }
  return messages.join('\n');
}
