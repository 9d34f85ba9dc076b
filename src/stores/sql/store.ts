import { createHash } from 'node:crypto';
import type {
  AtomicResult,
  AtomicStore,
  AtomicWorkResult,
  ClaimInput,
  PhaseStore,
  SavedStep,
  StoredResponse,
} from '../../core/contract/index.js';
import { ConfigError, RetrysafeError } from '../../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../../core/options/index.js';
import { atomicInFlight, BLOCKED_RETRY_AFTER_MS } from '../in-flight.js';
import {
  type AbandonedRow,
  abandonedLimit,
  abandonedOf,
  DEFAULT_PURGE_BATCH_SIZE,
  keyRecordOf,
  keysetPage,
  listRequest,
  purgeInBatches,
  type ResponseRow,
  requirePositiveInteger,
  type SummaryRow,
  summaryOf,
  toBuffer,
  Waiters,
} from '../internal.js';
import { pollUntilSettled } from '../poll-wait.js';
import { identifier, migrateIn } from '../postgres/migrate.js';
import { claimRecord, postgresStatements } from '../postgres/statements.js';
import { Ended, TRANSACTION_ENDED_RESPONSE, transactionEnded } from '../transaction-ended.js';
import type { SqlDriver, SqlResult } from './driver.js';

export type { SqlDialect, SqlDriver, SqlResult } from './driver.js';

/** Options of {@link sqlStore} and of each ORM's store (`drizzleStore`, `prismaStore`, …). */
export interface SqlStoreOptions {
  /**
   * The table holding the records.
   * @default 'idempotency_keys'
   */
  table?: string;
  /**
   * PostgreSQL: the schema of the table.
   * @default 'public'
   */
  schema?: string;
  /**
   * Create the table (and schema) on first use when missing. Off by default: the table is then
   * made by `store.migrate()`, `retrysafe migrate`, or your migration tool with the SQL of
   * `retrysafe migrate --print`; a store without it fails every call with a `ConfigError` saying so.
   * @default false
   */
  migrate?: boolean;
  /**
   * How long the store's own statements in atomic mode may wait on anything but a duplicate (a
   * locked table, a stuck server) when the engine gives no `storeTimeout`.
   * @default 15000
   */
  statementTimeoutMs?: number;
}

/**
 * A SQL store over a driver: lease mode through the `IdempotencyStore` methods, atomic mode and
 * phases inside the application's own transaction (`Tx`, the ORM's transaction object).
 */
export interface SqlStore<Tx> extends AtomicStore<Tx>, PhaseStore<Tx> {
  /** Creates the table (and schema) when missing; safe to run again and concurrently. */
  migrate(): Promise<void>;
  /** The driver the store's statements run on. */
  readonly driver: SqlDriver<Tx>;
}

const OPTION_NAMES = optionNames<SqlStoreOptions>({
  table: true,
  schema: true,
  migrate: true,
  statementTimeoutMs: true,
});

const LOCK_NOT_AVAILABLE = '55P03';
const UNDEFINED_TABLE = '42P01';
const UNDEFINED_COLUMN = '42703';
const INVALID_SCHEMA_NAME = '3F000';
const DIVISION_BY_ZERO = '22012';

/** Thrown out of the driver's transaction to roll it back with an answer that is not an error. */
class RollBack {
  constructor(readonly result: AtomicResult) {}
}

/**
 * A store whose statements run over `driver`: the dialect's SQL (one text per dialect, shared with
 * the `pg` store), the claim loop, owner-token fencing, and atomic mode in the application's own
 * transaction. A handler in atomic mode gets the driver's transaction object as `ctx.tx`; a
 * `transaction()` it opens there nests as a savepoint, so the key, its writes and the saved answer
 * still commit together. A handler that ends the transaction itself (a raw `COMMIT`) is caught
 * before the answer is saved: the call fails with {@link TransactionEndedError}, and the key keeps
 * a 500 answer so no retry runs the committed writes again.
 *
 * Waits poll the record (with in-process wakes); a driver gives no `LISTEN`.
 *
 * @example
 * ```ts
 * import { drizzleStore } from 'retrysafe/drizzle';
 * const store = drizzleStore(drizzle(pool), { migrate: true });
 * ```
 */
export function sqlStore<Tx>(driver: SqlDriver<Tx>, given: SqlStoreOptions = {}): SqlStore<Tx> {
  const options = checkOptions(`${driver.name}Store()`, given, OPTION_NAMES);
  const owner = `${driver.name}Store`;
  if (driver.dialect !== 'postgres') {
    throw new ConfigError(
      `${owner}: the ${driver.dialect} dialect has no SQL store over a driver yet; use retrysafe/${driver.dialect === 'mysql' ? 'mysql' : 'sqlite'}`,
    );
  }
  const schema = identifier('schema', options.schema ?? 'public');
  const table = identifier('table', options.table ?? 'idempotency_keys');
  const statementTimeoutMs = requirePositiveInteger(
    owner,
    'statementTimeoutMs',
    options.statementTimeoutMs ?? 15_000,
  );
  const qualified = `"${schema}"."${table}"`;
  const sql = postgresStatements(qualified);
  // The channel the `pg` store listens on for this table: its waiters wake on our changes too.
  const channel = `retrysafe_${createHash('sha1').update(qualified).digest('hex').slice(0, 12)}`;
  const notifyId = (scope: string, key: string) =>
    createHash('sha1').update(scope).update('\0').update(key).digest('base64');
  const waiters = new Waiters();
  const deduplicated = atomicInFlight();
  let migrating: Promise<void> | undefined;

  const query = <Row>(text: string, values: readonly unknown[]) => driver.query<Row>(text, values);

  let timeouts: Promise<string[]> | undefined;
  /** The session's lock and statement timeouts, which an atomic claim sets back; read once. */
  function sessionTimeouts(): Promise<string[]> {
    timeouts ??= query<{ name: string; reset_val: string }>(sql.SESSION_TIMEOUTS, []).then(
      ({ rows }) =>
        ['lock_timeout', 'statement_timeout'].map((name) => rows.find((row) => row.name === name)!.reset_val),
      (error: unknown) => {
        timeouts = undefined;
        throw error;
      },
    );
    return timeouts;
  }

  async function migrate(): Promise<void> {
    await driver.transaction((tx) =>
      migrateIn((text, values = []) => driver.queryIn(tx, text, values), schema, table),
    );
  }

  /**
   * Runs one of the store's statements: a missing table is a ConfigError that says what to do,
   * or, with `migrate: true`, is created (once, however many calls find it missing) and the
   * statement runs again.
   */
  async function own<T>(statement: () => Promise<T>, transaction = false): Promise<T> {
    try {
      return await statement();
    } catch (thrown) {
      // In a transaction only the statements before the work count: a missing table of the
      // application's own is the application's error.
      if (transaction && !(thrown instanceof BeforeWork)) throw thrown;
      const error = thrown instanceof BeforeWork ? thrown.cause : thrown;
      const code = driver.errorCode(error);
      if (code !== UNDEFINED_TABLE && code !== INVALID_SCHEMA_NAME && code !== UNDEFINED_COLUMN) throw error;
      if (!options.migrate) {
        throw new ConfigError(
          `${owner}: the table ${qualified} does not exist. Create it with store.migrate(), \`retrysafe migrate --database-url <url> --schema ${schema} --table ${table}\` (or your migration tool with the SQL of \`retrysafe migrate --print\`), or pass \`migrate: true\``,
          { cause: error },
        );
      }
      migrating ??= migrate().finally(() => {
        migrating = undefined;
      });
      await migrating;
      return statement();
    }
  }

  /** Changed one record: the notifying statements answer a row per record, the others count. */
  const changedOne = (result: SqlResult) => result.rows.length === 1 || result.affected === 1;

  function completeValues(scope: string, key: string, token: string, response: StoredResponse) {
    return [scope, key, token, response.status, JSON.stringify(response.headers), toBuffer(response.body)];
  }

  async function complete(scope: string, key: string, token: string, response: StoredResponse) {
    const values = [...completeValues(scope, key, token, response), channel, notifyId(scope, key)];
    const done = changedOne(await own(() => query(sql.COMPLETE, values)));
    if (done) waiters.wake(notifyId(scope, key));
    return done;
  }

  /**
   * Atomic mode in one transaction of the driver's: the claim (bounded: a duplicate blocks on the
   * primary key for `waitMs`, anything else for `timeoutMs`, both set and unset by the claim's
   * own statement), the handler's work on `tx`, and the saved answer, which must find the record
   * claimed by this same transaction (else the handler ended it: checked, and said so). The
   * claim's lease is its retention: no one sees an atomic claim before it commits with
   * its answer, unless a handler committed it early, and such a record must never be taken over.
   */
  async function atomicIn(
    input: ClaimInput,
    work: (tx: Tx) => Promise<AtomicWorkResult>,
  ): Promise<AtomicResult> {
    const waitMs = timerMs(Math.max(1, input.waitMs ?? input.leaseMs));
    const timeoutMs = timerMs(Math.max(1, input.timeoutMs ?? statementTimeoutMs));
    const claim = { ...input, leaseMs: Math.max(input.leaseMs, input.retainMs) };
    const bounds = [String(waitMs), String(waitMs + timeoutMs), ...(await sessionTimeouts())];
    let token: string | undefined;
    try {
      return await driver.transaction(async (tx) => {
        const run = <Row>(text: string, values: readonly unknown[] = []) =>
          driver.queryIn<Row>(tx, text, values);
        const claimed = await beforeWork(async () => {
          try {
            return await claimRecord(
              (take, values) => run(take ? sql.BOUNDED_TAKE_OVER : sql.BOUNDED_CLAIM, [...values, ...bounds]),
              claim,
            );
          } catch (error) {
            // lock_timeout: a duplicate's transaction held the key for all of `waitMs`.
            if (driver.errorCode(error) !== LOCK_NOT_AVAILABLE) throw error;
            return { outcome: 'in_progress', retryAfterMs: BLOCKED_RETRY_AFTER_MS } as const;
          }
        });
        if (claimed.outcome !== 'acquired') throw new RollBack(claimed);
        token = claimed.token;
        let result: AtomicWorkResult;
        try {
          result = await work(tx);
        } catch (error) {
          // Rolled back by the driver, unless the handler had ended the transaction first.
          if (await ended(run)) throw new Ended(error);
          throw error;
        }
        if (!result.commit) {
          if (await ended(run)) throw new Ended(undefined);
          throw new RollBack({ outcome: 'executed', response: result.response, committed: false });
        }
        const values = completeValues(input.scope, input.key, claimed.token, result.response);
        try {
          await run(sql.GUARDED_ATOMIC_COMPLETE, values);
        } catch (error) {
          if (driver.errorCode(error) !== DIVISION_BY_ZERO) throw error;
          if (await ended(run)) throw new Ended(error);
          throw new RetrysafeError(`${owner}: the atomic claim was lost before commit`, { cause: error });
        }
        return { outcome: 'executed', response: result.response, committed: true } as const;
      });
    } catch (error) {
      if (error instanceof RollBack) return error.result;
      if (error instanceof Ended && token !== undefined) {
        // The claim committed with the handler's writes: keep an answer on it so no retry runs them again.
        await complete(input.scope, input.key, token, TRANSACTION_ENDED_RESPONSE).catch(() => false);
        throw transactionEnded(owner, input.key, error.cause);
      }
      throw error;
    }
  }

  /**
   * Whether the operation's transaction has ended under us: the claim gave it a transaction id, so
   * a statement that finds none runs outside it (autocommit, after the handler's own COMMIT). A
   * transaction that is only aborted (a failed statement of the handler's) fails the check instead.
   */
  async function ended(run: Run): Promise<boolean> {
    try {
      const { rows } = await run<{ ended: boolean }>(sql.ENDED);
      return rows[0]?.ended === true;
    } catch {
      return false;
    }
  }

  /**
   * A phase in one transaction of the driver's: the record's row lock (a takeover waits for it), the
   * fence check, the work's writes on `tx` and the saved step commit together.
   */
  function phase(
    scope: string,
    key: string,
    token: string,
    work: (tx: Tx) => Promise<SavedStep>,
    request?: string,
  ): Promise<boolean> {
    return own(async () => {
      try {
        return await driver.transaction(async (tx) => {
          const { rows } = await beforeWork(() =>
            driver.queryIn<{ token: string }>(tx, sql.LOCK_OWNED, [scope, key]),
          );
          if (rows[0]?.token !== token) throw new RollBack({ outcome: 'mismatch' });
          const step = await work(tx);
          const values = [scope, key, token, step.name, step.value, request ?? null];
          return changedOne(await driver.queryIn(tx, sql.SAVE_STEP, values));
        });
      } catch (error) {
        if (error instanceof RollBack) return false;
        throw error;
      }
    }, true);
  }

  return {
    name: driver.name,
    driver,
    migrate,

    claim(input) {
      return own(() => claimRecord((take, values) => query(take ? sql.TAKE_OVER : sql.CLAIM, values), input));
    },

    complete,

    async release(scope, key, token) {
      const done = changedOne(
        await own(() => query(sql.RELEASE, [scope, key, token, channel, notifyId(scope, key)])),
      );
      if (done) waiters.wake(notifyId(scope, key));
      return done;
    },

    async saveStep(scope, key, token, step, request) {
      const values = [scope, key, token, step.name, step.value, request ?? null];
      return changedOne(await own(() => query(sql.SAVE_STEP, values)));
    },

    phase,

    async abandoned(options = {}) {
      const limit = abandonedLimit(`${owner}.abandoned`, options);
      const { rows } = await own(() => query<AbandonedRow>(sql.ABANDONED, [limit]));
      return rows.map(abandonedOf);
    },

    async renew(scope, key, token, leaseMs) {
      return changedOne(await own(() => query(sql.RENEW, [scope, key, token, leaseMs])));
    },

    async wait(scope, key, timeoutMs) {
      await pollUntilSettled(waiters, notifyId(scope, key), timeoutMs, async () => {
        const { rows } = await own(() => query<{ lease_left_ms: string }>(sql.LEASE_LEFT, [scope, key]));
        return rows[0] ? Number(rows[0].lease_left_ms) : null;
      });
    },

    async purgeExpired(batchSize = DEFAULT_PURGE_BATCH_SIZE) {
      requirePositiveInteger(`${owner}.purgeExpired`, 'batchSize', batchSize);
      return purgeInBatches(batchSize, async () => (await own(() => query(sql.PURGE, [batchSize]))).affected);
    },

    async list(options = {}) {
      const { limit, ...page } = listRequest(`${owner}.list`, options, 2);
      const { text, values } = sql.list(limit, page);
      const { rows } = await own(() => query<SummaryRow>(text, values));
      return keysetPage(rows.map(summaryOf), limit);
    },

    async get(scope, key, options) {
      const text = options?.response ? sql.GET_WITH_RESPONSE : sql.GET;
      const { rows } = await own(() => query<SummaryRow & ResponseRow>(text, [scope, key]));
      return rows[0] && keyRecordOf(summaryOf(rows[0]), rows[0], options);
    },

    async delete(scope, key) {
      const done = changedOne(
        await own(() => query(sql.DELETE, [scope, key, channel, notifyId(scope, key)])),
      );
      if (done) waiters.wake(notifyId(scope, key));
      return done;
    },

    atomic(input, work) {
      return deduplicated(input, (waitMs) => own(() => atomicIn({ ...input, waitMs }, work), true));
    },

    async close() {
      // The driver's connections are the application's: the store opened nothing of its own.
      waiters.wakeAll();
    },
  };
}

type Run = <Row>(text: string, values?: readonly unknown[]) => Promise<SqlResult<Row>>;

/** A failure of the store's statements before the work ran, inside a transaction. */
class BeforeWork {
  constructor(readonly cause: unknown) {}
}

async function beforeWork<T>(statements: () => Promise<T>): Promise<T> {
  try {
    return await statements();
  } catch (error) {
    throw new BeforeWork(error);
  }
}
