import type { ClaimInput, ClaimResult, SavedStep, StoredResponse } from '../../core/store.js';
import type { SqlResult, SqlStatement, StatementBound } from './driver.js';

/** One statement in the driver's placeholders, with its values. */
export interface Statement {
  text: string;
  values: readonly unknown[];
}

/**
 * Runs a statement on whatever the caller holds: the driver (autocommit) or a transaction of it,
 * where a driver that can bounds it client side by `bound` (see `SqlDriver.queryIn`); in a
 * transaction, with the driver's `pipelineIn` and `prepareIn` on it where the driver has them.
 */
export type Run = (<Row>(
  text: string,
  values?: readonly unknown[],
  bound?: StatementBound,
) => Promise<SqlResult<Row>>) & {
  pipeline?: (statements: readonly SqlStatement[], timeoutMs: number) => Promise<SqlResult[]>;
  prepare?: (texts: readonly string[], timeoutMs: number) => Promise<void>;
};

/**
 * What the SQL store asks of a dialect: its texts (written once per dialect, shared with the
 * dialect's own store) and the few steps a dialect does its own way (the claim, atomic mode's
 * bounds, completion and ended check, the migration). The store keeps the loop around them: the
 * missing table, the transaction, fencing by counts, the waits.
 */
export interface StoreDialect {
  /** The table as the dialect names it, for messages. */
  readonly qualified: string;
  /** What creates the table, for the ConfigError of a store without it. */
  readonly migrateHint: string;
  /** The channel the statements notify on when a record leaves progress, for a driver that listens. */
  readonly channel?: string;
  /**
   * Whether the database's error `code` (or, where the code is too broad, as SQLite's
   * `SQLITE_ERROR` is, the `error` itself) says the table (or a column of this release) is missing.
   */
  missing(code: string | undefined, error: unknown): boolean;
  /** Creates the table; every statement on `run`, one connection (some share a session). */
  migrate(run: Run): Promise<void>;
  /** A lease-mode claim, in autocommit. */
  claim(run: Run, input: ClaimInput): Promise<ClaimResult>;
  /**
   * Answers a retry of a completed record by a read in autocommit, before atomic mode opens its
   * transaction (SQLite's takes the write lock, which a replay does not need); `undefined` goes on
   * to the transaction.
   */
  settled?(run: Run, input: ClaimInput): Promise<Exclude<ClaimResult, { outcome: 'acquired' }> | undefined>;
  /**
   * Runs before each atomic call opens its transaction, outside it (what a dialect reads once per
   * store on a connection of its own, which a one-connection pool could not give inside it).
   */
  beforeAtomic?(): Promise<void>;
  /**
   * Atomic mode's claim inside the operation's transaction, a duplicate's wait bounded by `waitMs`
   * (then `in_progress`) and anything else by `timeoutMs`; the handler's statements never run
   * under those bounds. `undefined`: the transaction was lost (a deadlock) or the record changed
   * under the claim; the store runs the transaction again.
   */
  boundedClaim(
    run: Run,
    input: ClaimInput,
    waitMs: number,
    timeoutMs: number,
  ): Promise<ClaimResult | undefined>;
  /**
   * Saves the answer in the operation's transaction, which must still be the one that claimed:
   * `undefined` when saved, else `{ cause }` (the claim was lost, or the handler ended the
   * transaction and the statement ran outside it).
   */
  atomicComplete(
    run: Run,
    scope: string,
    key: string,
    token: string,
    response: StoredResponse,
  ): Promise<{ cause: unknown } | undefined>;
  /** Whether the transaction that claimed has ended under us; false when unsure. */
  ended(run: Run): Promise<boolean>;
  complete(scope: string, key: string, token: string, response: StoredResponse): Statement;
  release(scope: string, key: string, token: string): Statement;
  saveStep(scope: string, key: string, token: string, step: SavedStep, request: string | null): Statement;
  /** Locks a live record in progress, answering its `token`. */
  lockOwned(scope: string, key: string): Statement;
  abandoned(limit: number): Statement;
  renew(scope: string, key: string, token: string, leaseMs: number): Statement;
  /** A live record in progress: its `lease_left_ms`. */
  leaseLeft(scope: string, key: string): Statement;
  purge(batchSize: number): Statement;
  list(limit: number, page: { scope: string | undefined; after: string[] | undefined }): Statement;
  get(scope: string, key: string, response: boolean): Statement;
  delete(scope: string, key: string): Statement;
}

/** Changed one record: the statements that notify answer a row per record, the others count. */
export const changedOne = (result: SqlResult) => result.rows.length === 1 || result.affected === 1;
