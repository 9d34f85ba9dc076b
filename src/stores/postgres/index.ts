import { createHash } from 'node:crypto';
import pg from 'pg';
import type {
  AtomicResult,
  AtomicStore,
  AtomicWorkResult,
  ClaimInput,
  ClaimResult,
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
import { Ended, TRANSACTION_ENDED_RESPONSE, transactionEnded } from '../transaction-ended.js';
import { identifier, migrateIn, postgresMigrationSql } from './migrate.js';
import {
  prepare,
  preparedAll,
  preparedOn,
  type Statement,
  type TypedStatement,
  withValues,
} from './prepared.js';
import { type ClaimQuery, claimRecord, postgresStatements, type RecordRow } from './statements.js';

export { postgresMigrationSql };

/** Options of {@link postgresStore}: one of `pool` or `connectionString`. */
export interface PostgresStoreOptions {
  /**
   * A `pg` pool to use. The store never ends it, and its owner should handle its `error` event
   * (a dropped idle connection is otherwise an uncaught error). One of `pool`/`connectionString`.
   * @default undefined
   * @example pool: new pg.Pool({ connectionString: process.env.DATABASE_URL })
   */
  pool?: pg.Pool;
  /**
   * A `postgres://` URL; the store then owns a pool built with the timeouts below.
   * @default undefined
   * @example connectionString: 'postgres://app@127.0.0.1:5432/app'
   */
  connectionString?: string;
  /**
   * Schema of the table; `migrate()` creates it when missing.
   * @default 'public'
   * @example schema: 'shop'
   */
  schema?: string;
  /**
   * The table holding the records.
   * @default 'idempotency_keys'
   */
  table?: string;
  /**
   * Connections of the store's own pool.
   * @default 10
   */
  maxConnections?: number;
  /**
   * How long opening a connection of the store's own pool may take before the call rejects, so
   * an unreachable database fails fast instead of hanging a request.
   * @default 5000
   */
  connectTimeoutMs?: number;
  /**
   * Server-side `statement_timeout` of the store's own pool (a client-side guard fires a second
   * later for a network that stopped answering). Also bounds an atomic claim given no `timeoutMs`.
   * @default 15000
   */
  statementTimeoutMs?: number;
  /**
   * `client_connection_check_interval` of the store's own pool (PostgreSQL 14+): how often a
   * backend running a query checks that its client is still there, and ends the query when it is
   * not. A process that died (kill -9, a lost host) then leaves no statement queued on a lock to
   * commit after its lease, when a retry has run the handler again. `0` turns it off. Set the
   * same on a pool you pass in: `options: '-c client_connection_check_interval=1000'`.
   * @default 1000
   */
  connectionCheckIntervalMs?: number;
  /**
   * Create the schema, table and index on first use when they are missing, as `migrate()` does.
   * Off by default: the table is then made by `retrysafe migrate` (or your own migration tool,
   * from `retrysafe migrate --print`), and a store without it fails every call with a
   * `ConfigError` saying so.
   * @default false
   */
  migrate?: boolean;
  /**
   * What `connectionString` (or `pool`) connects to. `'session'`: each connection is a PostgreSQL
   * session of its own (a direct connection, or a pooler in session mode). `'transaction'`: a
   * pooler in transaction mode (PgBouncer's `pool_mode = transaction`), where consecutive
   * transactions of one connection may run on different server sessions. The store then sends no
   * startup parameters (PgBouncer refuses them: set `statement_timeout` and
   * `client_connection_check_interval` on the database role instead), prepares no statement
   * (neither `pg`'s named ones nor SQL `PREPARE`), keeps every setting it makes `SET LOCAL` to one
   * transaction, and waits by polling, since `LISTEN` holds no session there to be notified on.
   * @default 'session'
   * @example pooling: 'transaction'
   */
  pooling?: 'session' | 'transaction';
}

/** The PostgreSQL store: lease mode through the `IdempotencyStore` methods, atomic mode through `atomic`. */
export interface PostgresStore extends AtomicStore<pg.PoolClient>, PhaseStore<pg.PoolClient> {
  /**
   * Creates the schema, table and index when missing (the statements of `postgresMigrationSql`);
   * safe to run again and concurrently.
   */
  migrate(): Promise<void>;
  /** The pool the store queries; handlers in atomic mode get a client of it as `tx`. */
  readonly pool: pg.Pool;
}

const LOCK_NOT_AVAILABLE = '55P03';
const UNDEFINED_TABLE = '42P01';
/** A table made before steps existed: `migrate` adds their columns. */
const UNDEFINED_COLUMN = '42703';
const INVALID_SCHEMA_NAME = '3F000';
const MISSING_PREPARED_STATEMENT = '26000';
const DIVISION_BY_ZERO = '22012';

const OPTION_NAMES = optionNames<PostgresStoreOptions>({
  pool: true,
  connectionString: true,
  schema: true,
  table: true,
  maxConnections: true,
  connectTimeoutMs: true,
  statementTimeoutMs: true,
  connectionCheckIntervalMs: true,
  migrate: true,
  pooling: true,
});

/**
 * A store on PostgreSQL through `pg`, for several app servers or hosts sharing one database.
 * Claims are one `INSERT … ON CONFLICT` on the `(scope, key)` primary key; every time comes from
 * the database server's clock; waits use `LISTEN/NOTIFY` (one listening connection per store) with
 * polling as the fallback. `atomic()` runs the claim, the handler's queries on `tx` and the saved
 * response in one transaction: a crash leaves all of it or none of it, and a concurrent duplicate
 * blocks on the primary key until the first commits (then replays) or rolls back (then runs).
 *
 * Create its table once before use: `migrate()`, `retrysafe migrate --database-url …`, the SQL of
 * `retrysafe migrate --print` in your own migration tool, or the `migrate: true` option. Without
 * it every call fails with a `ConfigError` that says so.
 *
 * @example
 * ```ts
 * import { postgresStore } from 'retrysafe/postgres';
 * const store = postgresStore({ connectionString: process.env.DATABASE_URL, schema: 'app' });
 * await store.migrate();
 * ```
 */
export function postgresStore(given: PostgresStoreOptions): PostgresStore {
  const options = checkOptions('postgresStore()', given, OPTION_NAMES);
  if ((options.pool === undefined) === (options.connectionString === undefined)) {
    throw new ConfigError('postgresStore: give exactly one of `pool` or `connectionString`');
  }
  const schema = identifier('schema', options.schema ?? 'public');
  const table = identifier('table', options.table ?? 'idempotency_keys');
  const maxConnections = requirePositiveInteger(
    'postgresStore',
    'maxConnections',
    options.maxConnections ?? 10,
  );
  const connectTimeoutMs = requirePositiveInteger(
    'postgresStore',
    'connectTimeoutMs',
    options.connectTimeoutMs ?? 5000,
  );
  const statementTimeoutMs = requirePositiveInteger(
    'postgresStore',
    'statementTimeoutMs',
    options.statementTimeoutMs ?? 15_000,
  );

  const pooling = options.pooling ?? 'session';
  if (pooling !== 'session' && pooling !== 'transaction') {
    throw new ConfigError(
      `postgresStore: option \`pooling\` must be 'session' or 'transaction'; got ${JSON.stringify(options.pooling)}`,
    );
  }
  const transactionPooling = pooling === 'transaction';
  if (transactionPooling && options.connectionCheckIntervalMs !== undefined) {
    throw new ConfigError(
      "postgresStore: option `connectionCheckIntervalMs` cannot reach PostgreSQL through a transaction pooler (`pooling: 'transaction'`); set it on the role: ALTER ROLE app SET client_connection_check_interval = 1000",
    );
  }
  const connectionCheckIntervalMs = options.connectionCheckIntervalMs ?? 1000;
  if (!Number.isSafeInteger(connectionCheckIntervalMs) || connectionCheckIntervalMs < 0) {
    throw new ConfigError(
      `postgresStore: option \`connectionCheckIntervalMs\` must be a whole number of ms, 0 or more; got ${String(options.connectionCheckIntervalMs)}`,
    );
  }

  const ownsPool = options.pool === undefined;
  const pool =
    options.pool ??
    new pg.Pool({
      connectionString: options.connectionString,
      max: maxConnections,
      connectionTimeoutMillis: connectTimeoutMs,
      query_timeout: timerMs(statementTimeoutMs + 1000),
      keepAlive: true,
      application_name: 'retrysafe',
      // Startup parameters, which PgBouncer refuses.
      ...(transactionPooling
        ? {}
        : {
            statement_timeout: timerMs(statementTimeoutMs),
            options: `-c client_connection_check_interval=${connectionCheckIntervalMs}`,
          }),
    });
  // A connection dropped while idle (database restart) surfaces here; the next query reconnects.
  if (ownsPool) pool.on('error', () => {});

  const qualified = `"${schema}"."${table}"`;
  // One name per table so two stores on one pool never share a prepared statement of another text.
  const tag = createHash('sha1').update(qualified).digest('hex').slice(0, 12);
  const channel = `retrysafe_${tag}`;
  const notifyId = (scope: string, key: string) =>
    createHash('sha1').update(scope).update('\0').update(key).digest('base64');

  const sql = postgresStatements(qualified);
  // Prepared by `pg` under one name per table, so two stores on one pool never share a prepared
  // statement of another text.
  const named = (name: string, text: string): Statement => ({ name: `retrysafe_${name}_${tag}`, text });
  const CLAIM = named('claim', sql.CLAIM);
  const TAKE_OVER = named('take_over', sql.TAKE_OVER);
  const LEASE_LEFT = named('lease_left', sql.LEASE_LEFT);
  const COMPLETE = named('complete', sql.COMPLETE);
  const SAVE_STEP = named('save_step', sql.SAVE_STEP);
  const LOCK_OWNED = named('lock_owned', sql.LOCK_OWNED);
  const ABANDONED = named('abandoned', sql.ABANDONED);
  // Names of their own: SQL PREPARE shares the namespace of the protocol-level statements `pg` prepares.
  const CLAIM_TYPES = ['text', 'text', 'text', 'text', 'bigint', 'bigint'];
  const ATOMIC = {
    claim: { ...named('atomic_claim', sql.CLAIM), types: CLAIM_TYPES },
    takeOver: { ...named('atomic_take_over', sql.TAKE_OVER), types: CLAIM_TYPES },
    // Sent with the COMMIT in one round trip (statements.ts says why it divides by its count).
    complete: {
      ...named('atomic_complete', sql.ATOMIC_COMPLETE),
      types: ['text', 'text', 'text', 'integer', 'json', 'bytea'],
    },
  } satisfies Record<string, TypedStatement>;
  const ATOMIC_STATEMENTS = Object.values(ATOMIC);
  const RELEASE = named('release', sql.RELEASE);
  const DELETE = named('delete', sql.DELETE);
  const RENEW = named('renew', sql.RENEW);
  const PURGE = named('purge', sql.PURGE);

  /** Runs one of the statements above on the pool, prepared by `pg` unless a transaction pooler is between. */
  function run<R extends pg.QueryResultRow>(statement: Statement, values: unknown[]) {
    return pool.query<R>(onClient(statement, values));
  }

  /** A statement's query config: unnamed behind a transaction pooler, which cannot keep it prepared. */
  function onClient(statement: Statement, values: unknown[]): pg.QueryConfig {
    return transactionPooling ? { text: statement.text, values } : { ...statement, values };
  }

  function completeValues(scope: string, key: string, token: string, response: StoredResponse) {
    return [scope, key, token, response.status, JSON.stringify(response.headers), toBuffer(response.body)];
  }

  const waiters = new Waiters();
  const deduplicated = atomicInFlight();
  let listener: Promise<pg.Client> | undefined;
  let closed = false;

  function listen(): void {
    if (listener || closed || transactionPooling) return;
    const client = new pg.Client({ ...pool.options, connectionTimeoutMillis: connectTimeoutMs });
    let dropped = false;
    const drop = () => {
      if (dropped) return;
      dropped = true;
      if (current === listener) listener = undefined;
      client.removeAllListeners('notification');
      client.end().catch(() => {});
    };
    client.on('error', drop);
    client.on('end', drop);
    client.on('notification', (message) => {
      if (message.channel === channel && message.payload) waiters.wake(message.payload);
    });
    const current = (async () => {
      await client.connect();
      await client.query(`LISTEN "${channel}"`);
      return client;
    })();
    listener = current;
    // Until the listener is up (or after it drops), waits fall back to polling.
    current.catch(drop);
  }

  async function migrateOn(client: pg.PoolClient): Promise<void> {
    try {
      await client.query('BEGIN');
      await migrateIn((text, values) => client.query(text, values), schema, table);
      await client.query('COMMIT');
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {});
      throw error;
    }
  }

  async function migrate(): Promise<void> {
    const client = await pool.connect().catch((error: unknown) => {
      throw pgbouncerRefusal(error);
    });
    try {
      await migrateOn(client);
    } finally {
      client.release();
    }
  }

  let migrating: Promise<void> | undefined;

  /**
   * Runs one of the store's own statements. A missing table fails it with a ConfigError that says
   * what to do, rather than a driver error behind a 503; with `migrate: true` the table is created
   * (once, however many calls find it missing) and the statement runs again. A call holding a
   * connection (`atomic`) migrates on it, so a one-connection pool cannot deadlock.
   */
  async function own<T>(statement: () => Promise<T>, client?: pg.PoolClient): Promise<T> {
    try {
      return await statement();
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code !== UNDEFINED_TABLE && code !== INVALID_SCHEMA_NAME && code !== UNDEFINED_COLUMN) {
        throw pgbouncerRefusal(error);
      }
      if (!options.migrate) {
        throw new ConfigError(
          `postgresStore: the table ${qualified} does not exist. Create it with \`retrysafe migrate --database-url <url> --schema ${schema} --table ${table}\` (or store.migrate(), or your migration tool with the SQL of \`retrysafe migrate --print\`), or pass \`migrate: true\``,
          { cause: error },
        );
      }
      migrating ??= (client ? migrateOn(client) : migrate()).finally(() => {
        migrating = undefined;
      });
      await migrating;
      return statement();
    }
  }

  async function complete(scope: string, key: string, token: string, response: StoredResponse) {
    const { rowCount } = await own(() =>
      run(COMPLETE, [...completeValues(scope, key, token, response), channel, notifyId(scope, key)]),
    );
    return rowCount === 1;
  }

  return {
    name: 'postgres',
    pool,

    migrate,

    claim(input) {
      return own(() =>
        claimRecord((take, values) => run<RecordRow>(take ? TAKE_OVER : CLAIM, values), input),
      );
    },

    complete,

    async release(scope, key, token) {
      const { rowCount } = await own(() => run(RELEASE, [scope, key, token, channel, notifyId(scope, key)]));
      return rowCount === 1;
    },

    async saveStep(scope, key, token, step, request) {
      const values = [scope, key, token, step.name, step.value, request ?? null];
      const { rowCount } = await own(() => run(SAVE_STEP, values));
      return rowCount === 1;
    },

    phase,

    async abandoned(options = {}) {
      const limit = abandonedLimit('postgresStore.abandoned', options);
      const { rows } = await own(() => run<AbandonedRow>(ABANDONED, [limit]));
      return rows.map(abandonedOf);
    },

    async renew(scope, key, token, leaseMs) {
      const { rowCount } = await own(() => run(RENEW, [scope, key, token, leaseMs]));
      return rowCount === 1;
    },

    async wait(scope, key, timeoutMs) {
      listen();
      await pollUntilSettled(waiters, notifyId(scope, key), timeoutMs, async () => {
        const { rows } = await own(() => run<{ lease_left_ms: string }>(LEASE_LEFT, [scope, key]));
        return rows[0] ? Number(rows[0].lease_left_ms) : null;
      });
    },

    async purgeExpired(batchSize = DEFAULT_PURGE_BATCH_SIZE) {
      requirePositiveInteger('postgresStore.purgeExpired', 'batchSize', batchSize);
      // Back to back, batches took a backend's whole core from the requests (p99 ×2.6 during a
      // 1 M purge on 2 cores); the rests leave them half.
      return purgeInBatches(batchSize, async () => (await own(() => run(PURGE, [batchSize]))).rowCount ?? 0);
    },

    async list(options = {}) {
      const { limit, ...page } = listRequest('postgresStore.list', options, 2);
      const { text, values } = sql.list(limit, page);
      const { rows } = await own(() => pool.query<SummaryRow>(text, values));
      return keysetPage(rows.map(summaryOf), limit);
    },

    async get(scope, key, options) {
      const text = options?.response ? sql.GET_WITH_RESPONSE : sql.GET;
      const { rows } = await own(() => pool.query<SummaryRow & ResponseRow>(text, [scope, key]));
      return rows[0] && keyRecordOf(summaryOf(rows[0]), rows[0], options);
    },

    async delete(scope, key) {
      const { rowCount } = await own(() => run(DELETE, [scope, key, channel, notifyId(scope, key)]));
      return rowCount === 1;
    },

    atomic(input, work) {
      return deduplicated(input, (waitMs) => atomicOnClient({ ...input, waitMs }, work));
    },

    async close() {
      closed = true;
      waiters.wakeAll();
      const current = listener;
      listener = undefined;
      if (current) await current.then((client) => client.end()).catch(() => {});
      if (ownsPool) await pool.end();
    },
  };

  /**
   * A phase on a client of its own: the row lock (FOR UPDATE), the fence check, the work's queries
   * and the saved step commit together. An owner that dies inside it leaves an open transaction
   * the server rolls back when the connection goes; one whose key was taken over finds another
   * token under the lock and runs nothing.
   */
  async function phase(
    scope: string,
    key: string,
    token: string,
    work: (tx: pg.PoolClient) => Promise<SavedStep>,
    request?: string,
  ): Promise<boolean> {
    const client = await pool.connect();
    let broken: unknown;
    try {
      await client.query('BEGIN');
      const { rows } = await own(
        () => client.query<{ token: string }>(onClient(LOCK_OWNED, [scope, key])),
        client,
      );
      if (rows[0]?.token !== token) {
        await client.query('ROLLBACK');
        return false;
      }
      const step = await work(client);
      const values = [scope, key, token, step.name, step.value, request ?? null];
      const { rowCount } = await client.query(onClient(SAVE_STEP, values));
      await client.query('COMMIT');
      return rowCount === 1;
    } catch (error) {
      await client.query('ROLLBACK').catch((failed: unknown) => {
        broken = failed;
      });
      throw error;
    } finally {
      client.release(broken instanceof Error ? broken : undefined);
    }
  }

  async function atomicOnClient(
    input: ClaimInput,
    work: (tx: pg.PoolClient) => Promise<AtomicWorkResult>,
  ): Promise<AtomicResult> {
    // A connection that dies between our queries (while the handler awaits something else)
    // would otherwise emit an unhandled 'error'; the next query on it rejects instead.
    let broken: Error | undefined;
    let claimedToken: string | undefined;
    /** Whether the handler ended the transaction that claimed (a COMMIT of its own); false if unsure. */
    const ended = () =>
      client
        .query<{ ended: boolean }>(sql.ENDED)
        .then(({ rows }) => rows[0]?.ended === true)
        .catch(() => false);
    const onError = (error: Error) => {
      broken = error;
    };
    // Listening from pg's own callback, not after `await pool.connect()`: a backend terminated
    // just after startup sends its FATAL in the same read as ReadyForQuery, and pg emits it on
    // the client in the tick it hands the client out, before an awaiting caller resumes.
    const client = await new Promise<pg.PoolClient>((resolve, reject) => {
      pool.connect((error, connected) => {
        if (error || !connected) return reject(pgbouncerRefusal(error));
        connected.on('error', onError);
        resolve(connected);
      });
    });
    try {
      const waitMs = timerMs(Math.max(1, input.waitMs ?? input.leaseMs));
      const timeoutMs = timerMs(Math.max(1, input.timeoutMs ?? statementTimeoutMs));
      const claimMs = timerMs(waitMs + timeoutMs);
      if (!transactionPooling && !preparedAll(client, ATOMIC_STATEMENTS)) {
        await own(() => prepare(client, ATOMIC_STATEMENTS, timeoutMs), client);
      }
      // Two bounds on the claim, not on the handler's own queries. A duplicate blocks on the
      // primary key until the original's transaction ends: `waitMs`, then lock_timeout says
      // in_progress. Anything else it waits on (the key table locked, a stuck server) is
      // `timeoutMs`, then statement_timeout fails the call. The table lock is taken first, under
      // statement_timeout alone, so that a locked table is never mistaken for a duplicate. A
      // simple query may hold several statements: the first one also opens the transaction.
      const BEGIN = `BEGIN; SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = ${timeoutMs};
          LOCK TABLE ${qualified} IN ROW EXCLUSIVE MODE; `;
      let begin = BEGIN;
      const query: ClaimQuery = async (take, values) => {
        const text = `${begin}SET LOCAL lock_timeout = ${waitMs};
            SET LOCAL statement_timeout = ${claimMs};
            ${withValues(take ? ATOMIC.takeOver : ATOMIC.claim, values, !transactionPooling)};
            SET LOCAL lock_timeout TO DEFAULT; SET LOCAL statement_timeout TO DEFAULT`;
        begin = '';
        try {
          // The client-side guard, for a network that stopped answering: safe at any moment,
          // since nothing commits without our COMMIT and the connection is then discarded.
          const results = (await client.query({
            text,
            query_timeout: claimMs,
          } as pg.QueryConfig)) as unknown as pg.QueryResult<RecordRow>[];
          return results[results.length - 3]!;
        } catch (error) {
          if ((error as { code?: string }).code === undefined) broken ??= error as Error;
          throw error;
        }
      };
      // An atomic claim's lease is its retention: no one sees it before it commits with its answer,
      // unless a handler committed it early, and such a record must never be taken over.
      const claim = { ...input, leaseMs: Math.max(input.leaseMs, input.retainMs) };
      let claimed: ClaimResult;
      try {
        claimed = await claimRecord(query, claim).catch(async (error) => {
          // DISCARD ALL or DEALLOCATE (the app, a pooler) dropped our statements: prepare again, once.
          if ((error as { code?: string }).code !== MISSING_PREPARED_STATEMENT) throw error;
          await client.query('ROLLBACK');
          preparedOn.delete(client);
          await prepare(client, ATOMIC_STATEMENTS, timeoutMs);
          begin = BEGIN;
          return claimRecord(query, claim);
        });
      } catch (error) {
        if ((error as { code?: string }).code !== LOCK_NOT_AVAILABLE) throw error;
        claimed = { outcome: 'in_progress', retryAfterMs: BLOCKED_RETRY_AFTER_MS };
      }
      if (claimed.outcome === 'acquired') claimedToken = claimed.token;
      if (claimed.outcome !== 'acquired') {
        // The claim wrote nothing: its ROLLBACK is sent and not waited for, so a replay answers
        // after one round trip, not two. The client goes back to the pool meanwhile; a pg client
        // runs its queries in order, so whoever takes it next queues behind the ROLLBACK, and a
        // connection lost in it is dropped by the pool.
        client.query('ROLLBACK').catch(() => undefined);
        return claimed;
      }
      let result: AtomicWorkResult;
      try {
        result = await work(client);
      } catch (error) {
        // Rolled back below, unless the handler had ended the transaction first.
        if (await ended()) throw new Ended(error);
        throw error;
      }
      if (!result.commit) {
        if (await ended()) throw new Ended(undefined);
        await client.query('ROLLBACK');
        return { outcome: 'executed', response: result.response, committed: false };
      }
      const values = completeValues(input.scope, input.key, claimed.token, result.response);
      try {
        // The completion must find the record claimed by this very transaction (its xmin), so a
        // transaction the handler committed itself fails here rather than completing in autocommit.
        await client.query(`${withValues(ATOMIC.complete, values, !transactionPooling)}; COMMIT`);
      } catch (error) {
        if ((error as { code?: string }).code !== DIVISION_BY_ZERO) throw error;
        if (await ended()) throw new Ended(error);
        throw new RetrysafeError('postgresStore: the atomic claim was lost before commit', { cause: error });
      }
      return { outcome: 'executed', response: result.response, committed: true };
    } catch (error) {
      if (!broken) {
        await client.query('ROLLBACK').catch((rollbackError: Error) => {
          broken ??= rollbackError;
        });
      }
      if (!(error instanceof Ended)) throw error;
      // The claim committed with the handler's writes: keep an answer on it so no retry runs them again.
      await complete(input.scope, input.key, claimedToken as string, TRANSACTION_ENDED_RESPONSE).catch(
        () => false,
      );
      throw transactionEnded('postgresStore', input.key, error.cause);
    } finally {
      client.off('error', onError);
      client.release(broken);
    }
  }
}

/**
 * PgBouncer refuses a connection whose startup packet sets what it does not know (our pool sets
 * `statement_timeout` and `options`): said as a ConfigError naming the option that avoids it.
 */
function pgbouncerRefusal(error: unknown): unknown {
  const message = (error as Error | undefined)?.message ?? '';
  if (!message.startsWith('unsupported startup parameter')) return error;
  return new ConfigError(
    `postgresStore: the server refused the connection's startup parameters (${message}), as PgBouncer does: behind PgBouncer pass \`pooling: 'transaction'\` (or 'session' with ignore_startup_parameters in its config), and set no \`options\` or \`statement_timeout\` on a pool of your own`,
    { cause: error },
  );
}
