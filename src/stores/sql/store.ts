import { createHash } from 'node:crypto';
import { ConfigError, RetrysafeError } from '../../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../../core/options/index.js';
import type {
  AtomicResult,
  AtomicStore,
  AtomicWorkResult,
  ClaimInput,
  PhaseStore,
  SavedStep,
  StoredResponse,
} from '../../core/store.js';
import { atomicInFlight } from '../in-flight.js';
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
  Waiters,
} from '../internal.js';
import { pollUntilSettled } from '../poll-wait.js';
import { Ended, TRANSACTION_ENDED_RESPONSE, transactionEnded } from '../transaction-ended.js';
import { changedOne, type Run, type Statement, type StoreDialect } from './dialect.js';
import { mysqlDialect } from './dialects/mysql.js';
import { postgresDialect } from './dialects/postgres.js';
import { sqliteDialect } from './dialects/sqlite.js';
import type { SqlDriver } from './driver.js';
import { TableMissingError } from './table-missing.js';

export type { SqlDialect, SqlDriver, SqlResult, StatementBound, TransactionOptions } from './driver.js';

/** Options of {@link sqlStore} and of each ORM's store (`drizzleStore`, `prismaStore`, …). */
export interface SqlStoreOptions {
  /**
   * The table holding the records.
   * @default 'idempotency_keys'
   */
  table?: string;
  /**
   * PostgreSQL: the schema of the table (on MySQL, the connection's database holds it; giving one
   * is a ConfigError).
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

/** A claim that lost its transaction (a deadlock) or found the record changing under it asks again. */
const CLAIM_ATTEMPTS = 4;

/** Thrown out of the driver's transaction to roll it back with an answer that is not an error. */
class RollBack {
  constructor(readonly result: AtomicResult) {}
}

/**
 * A store whose statements run over `driver`: the dialect's SQL (PostgreSQL's shared with the `pg`
 * store, MySQL's with the `mysql` store; see dialect.ts), the claim loop, owner-token fencing, and atomic mode in the application's own
 * transaction. A handler in atomic mode gets the driver's transaction object as `ctx.tx`; a
 * `transaction()` it opens there nests as a savepoint, so the key, its writes and the saved answer
 * still commit together. A handler that ends the transaction itself (a raw `COMMIT`) is caught
 * before the answer is saved: the call fails with {@link TransactionEndedError}, and the key keeps
 * a 500 answer so no retry runs the committed writes again.
 *
 * Waits poll the record (with in-process wakes), and listen where the driver can (`pg`'s LISTEN).
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
  const dialect = dialectOf(owner, driver, options);
  const statementTimeoutMs = requirePositiveInteger(
    owner,
    'statementTimeoutMs',
    options.statementTimeoutMs ?? 15_000,
  );
  const { qualified } = dialect;
  /** The in-process waiters' name for a record. */
  const recordId = (scope: string, key: string) =>
    createHash('sha1').update(scope).update('\0').update(key).digest('base64');
  const waiters = new Waiters();
  const deduplicated = atomicInFlight();
  let migrating: Promise<void> | undefined;
  let closed = false;

  const autocommit: Run = (text, values = []) => driver.query(text, values);
  const query = <Row>({ text, values }: Statement) => driver.query<Row>(text, values);

  /** Runs statements in `tx`, with what the driver can do beyond one statement a round trip. */
  function runIn(tx: Tx): Run {
    const run: Run = (text, values = [], bound) => driver.queryIn(tx, text, values, bound);
    if (driver.pipelineIn) run.pipeline = (statements, ms) => driver.pipelineIn!(tx, statements, ms);
    if (driver.prepareIn) run.prepare = (texts, ms) => driver.prepareIn!(tx, texts, ms);
    return run;
  }

  async function migrate(): Promise<void> {
    await driver.transaction((tx) =>
      dialect.migrate((text, values = []) => driver.queryIn(tx, text, values)),
    );
  }

  /**
   * Runs one of the store's statements: a missing table is a ConfigError that says what to do,
   * or, with `migrate: true`, is created (once, however many calls find it missing) and the
   * statement runs again. In a transaction, the one that failed has been rolled back by then: the
   * migration runs outside it (MySQL's DDL would commit it) and the statement opens another.
   */
  async function own<T>(statement: () => Promise<T>, transaction = false): Promise<T> {
    try {
      return await statement();
    } catch (thrown) {
      // In a transaction only the statements before the work count: a missing table of the
      // application's own is the application's error.
      if (transaction && !(thrown instanceof BeforeWork)) throw thrown;
      const error = thrown instanceof BeforeWork ? thrown.cause : thrown;
      if (!dialect.missing(driver.errorCode(error), error)) throw error;
      if (!options.migrate) {
        throw new TableMissingError(
          `${owner}: the table ${qualified} does not exist. Create it with store.migrate(), ${dialect.migrateHint} (or your migration tool with the SQL of \`retrysafe migrate --print\`), or pass \`migrate: true\``,
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

  async function complete(scope: string, key: string, token: string, response: StoredResponse) {
    const done = changedOne(await own(() => query(dialect.complete(scope, key, token, response))));
    if (done) waiters.wake(recordId(scope, key));
    return done;
  }

  /**
   * Atomic mode in one transaction of the driver's: the claim (bounded: a duplicate blocks on the
   * primary key for `waitMs`, anything else for `timeoutMs`, the dialect's way), the handler's
   * work on `tx`, and the saved answer, which must find the record claimed by this same
   * transaction (else the handler ended it: checked, and said so). The claim's lease is its
   * retention: no one sees an atomic claim before it commits with its answer, unless a handler
   * committed it early, and such a record must never be taken over.
   */
  async function atomicIn(
    input: ClaimInput,
    work: (tx: Tx) => Promise<AtomicWorkResult>,
  ): Promise<AtomicResult> {
    const waitMs = timerMs(Math.max(1, input.waitMs ?? input.leaseMs));
    const timeoutMs = timerMs(Math.max(1, input.timeoutMs ?? statementTimeoutMs));
    const claim = { ...input, leaseMs: Math.max(input.leaseMs, input.retainMs) };
    // The bound counts from the call: time queued behind this process's other statements (the
    // settled read on a one-connection SQLite) is time waited too.
    const deadlineMs = Date.now() + timeoutMs;
    const transactionOptions = () => ({ acquireTimeoutMs: Math.max(1, deadlineMs - Date.now()) });
    let token: string | undefined;
    if (dialect.settled) {
      const settled = await beforeWork(() => dialect.settled!(autocommit, input));
      if (settled) return settled;
    }
    await dialect.beforeAtomic?.();
    try {
      for (let attempt = 1; ; attempt++) {
        try {
          const committed = await driver.transaction(async (tx) => {
            const run = runIn(tx);
            const claimed = await beforeWork(() => dialect.boundedClaim(run, claim, waitMs, timeoutMs));
            if (!claimed) throw new ClaimAgain();
            if (claimed.outcome !== 'acquired') throw new RollBack(claimed);
            token = claimed.token;
            let result: AtomicWorkResult;
            try {
              result = await work(tx);
            } catch (error) {
              // Rolled back by the driver, unless the handler had ended the transaction first.
              if (await dialect.ended(run)) throw new Ended(error);
              throw error;
            }
            if (!result.commit) {
              if (await dialect.ended(run)) throw new Ended(undefined);
              throw new RollBack({ outcome: 'executed', response: result.response, committed: false });
            }
            // Saved and committed in one round trip where the driver can.
            const finish: Run = driver.commitWith
              ? (text, values = []) => driver.commitWith!(tx, text, values)
              : run;
            const lost = await dialect.atomicComplete(
              finish,
              input.scope,
              input.key,
              claimed.token,
              result.response,
            );
            if (lost) {
              if (await dialect.ended(run)) throw new Ended(lost.cause);
              throw new RetrysafeError(`${owner}: the atomic claim was lost before commit`, {
                cause: lost.cause,
              });
            }
            return { outcome: 'executed', response: result.response, committed: true } as const;
          }, transactionOptions());
          waiters.wake(recordId(input.scope, input.key));
          return committed;
        } catch (error) {
          if (!(error instanceof ClaimAgain)) throw error;
          if (attempt === CLAIM_ATTEMPTS) return { outcome: 'in_progress', retryAfterMs: 0 };
        }
      }
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
          const run: Run = (text, values = []) => driver.queryIn(tx, text, values);
          const locked = dialect.lockOwned(scope, key);
          const { rows } = await beforeWork(() => run<{ token: string }>(locked.text, locked.values));
          if (rows[0]?.token !== token) throw new RollBack({ outcome: 'mismatch' });
          const step = await work(tx);
          const saved = dialect.saveStep(scope, key, token, step, request ?? null);
          return changedOne(await run(saved.text, saved.values));
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
      return own(() => dialect.claim(autocommit, input));
    },

    complete,

    async release(scope, key, token) {
      const done = changedOne(await own(() => query(dialect.release(scope, key, token))));
      if (done) waiters.wake(recordId(scope, key));
      return done;
    },

    async saveStep(scope, key, token, step, request) {
      return changedOne(await own(() => query(dialect.saveStep(scope, key, token, step, request ?? null))));
    },

    phase,

    async abandoned(options = {}) {
      const limit = abandonedLimit(`${owner}.abandoned`, options);
      const { rows } = await own(() => query<AbandonedRow>(dialect.abandoned(limit)));
      return rows.map((row) => abandonedOf(withTextKeys(row)));
    },

    async renew(scope, key, token, leaseMs) {
      return changedOne(await own(() => query(dialect.renew(scope, key, token, leaseMs))));
    },

    async wait(scope, key, timeoutMs) {
      if (dialect.channel) driver.listen?.(dialect.channel, (id) => waiters.wake(id));
      await pollUntilSettled(
        waiters,
        recordId(scope, key),
        timeoutMs,
        async () => {
          if (closed) return null;
          const { rows } = await own(() => query<{ lease_left_ms: string }>(dialect.leaseLeft(scope, key)));
          return rows[0] ? Number(rows[0].lease_left_ms) : null;
        },
        driver.pollDelays,
      );
    },

    async purgeExpired(batchSize = DEFAULT_PURGE_BATCH_SIZE) {
      requirePositiveInteger(`${owner}.purgeExpired`, 'batchSize', batchSize);
      return purgeInBatches(
        batchSize,
        async () => (await own(() => query(dialect.purge(batchSize)))).affected,
      );
    },

    async list(options = {}) {
      const { limit, ...page } = listRequest(`${owner}.list`, options, 2);
      const { rows } = await own(() => query<SummaryRow>(dialect.list(limit, page)));
      return keysetPage(
        rows.map((row) => summaryOf(withTextKeys(row))),
        limit,
      );
    },

    async get(scope, key, options) {
      const { rows } = await own(() =>
        query<SummaryRow & ResponseRow>(dialect.get(scope, key, options?.response === true)),
      );
      return rows[0] && keyRecordOf(summaryOf(withTextKeys(rows[0])), rows[0], options);
    },

    async delete(scope, key) {
      const done = changedOne(await own(() => query(dialect.delete(scope, key))));
      if (done) waiters.wake(recordId(scope, key));
      return done;
    },

    atomic(input, work) {
      return deduplicated(input, (waitMs) => own(() => atomicIn({ ...input, waitMs }, work), true));
    },

    async close() {
      // The driver's connections are the application's: the store opened nothing of its own.
      closed = true;
      waiters.wakeAll();
    },
  };
}

/** The dialect of `driver`'s database. */
function dialectOf(owner: string, driver: SqlDriver<unknown>, options: SqlStoreOptions): StoreDialect {
  switch (driver.dialect) {
    case 'postgres':
      return postgresDialect(driver, options);
    case 'mysql':
      if (options.schema !== undefined) {
        throw new ConfigError(
          `${owner}: \`schema\` is PostgreSQL's; on MySQL the table is in the connection's database`,
        );
      }
      return mysqlDialect(driver, options);
    case 'sqlite':
      if (options.schema !== undefined) {
        throw new ConfigError(
          `${owner}: \`schema\` is PostgreSQL's; a SQLite database holds the table itself`,
        );
      }
      return sqliteDialect(driver, options);
    default:
      throw new ConfigError(`${owner}: no SQL dialect ${JSON.stringify(driver.dialect)}`);
  }
}

/** A row's scope and key as text: MySQL's byte-string columns come back as bytes. */
function withTextKeys<Row extends { scope: unknown; key: unknown }>(
  row: Row,
): Row & { scope: string; key: string } {
  return { ...row, scope: textOf(row.scope), key: textOf(row.key) };
}

function textOf(value: unknown): string {
  return typeof value === 'string' ? value : Buffer.from(value as Uint8Array).toString('utf8');
}

/** A failure of the store's statements before the work ran, inside a transaction. */
class BeforeWork {
  constructor(readonly cause: unknown) {}
}

/** Thrown out of the driver's transaction to roll it back and claim again in a new one. */
class ClaimAgain {}

async function beforeWork<T>(statements: () => Promise<T>): Promise<T> {
  try {
    return await statements();
  } catch (error) {
    throw new BeforeWork(error);
  }
}
