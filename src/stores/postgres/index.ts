import { createHash, randomUUID } from 'node:crypto';
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
  RESPONSE_COLUMNS,
  type ResponseRow,
  requirePositiveInteger,
  SUMMARY_COLUMNS,
  type SummaryRow,
  summaryOf,
  toBuffer,
  Waiters,
} from '../internal.js';
import { pollUntilSettled } from '../poll-wait.js';
import { identifier, postgresMigrationSql } from './migrate.js';
import {
  prepare,
  preparedAll,
  preparedOn,
  type Statement,
  type TypedStatement,
  withValues,
} from './prepared.js';

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

/**
 * A claim that finds the record changing under it (committed while the insert waited on it,
 * released, taken over by another retry) asks again; a few rounds settle any realistic interleaving.
 */
const CLAIM_ATTEMPTS = 4;
const LOCK_NOT_AVAILABLE = '55P03';
const NOW_MS = '(extract(epoch FROM clock_timestamp()) * 1000)::bigint';
const UNDEFINED_TABLE = '42P01';
/** A table made before steps existed: `migrate` adds their columns. */
const UNDEFINED_COLUMN = '42703';
const INVALID_SCHEMA_NAME = '3F000';
const MISSING_PREPARED_STATEMENT = '26000';
const DIVISION_BY_ZERO = '22012';
interface RecordRow {
  acquired: boolean;
  fingerprint: string;
  completed: boolean;
  lease_left_ms: string | null;
  claimable: boolean;
  status: number | null;
  headers: Record<string, string> | null;
  body: Buffer | null;
}

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

  // One round trip for the common cases: a new key inserts; an existing one is read back in the
  // same statement. DO NOTHING, unlike DO UPDATE, neither locks nor writes the existing row, so
  // replays of a hot key run in parallel. The read uses the statement's snapshot and so misses a
  // row committed while the insert waited on it; the caller then asks again.
  const CLAIM = {
    name: `retrysafe_claim_${tag}`,
    text: `WITH n AS (SELECT ${NOW_MS} AS ms),
      ins AS (
        INSERT INTO ${qualified} (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
        SELECT $1, $2, $3, $4, n.ms + $5, n.ms, n.ms + $6 FROM n
        ON CONFLICT (scope, key) DO NOTHING
        RETURNING token)
      SELECT true AS acquired, NULL AS fingerprint, false AS completed, NULL AS lease_left_ms,
        false AS claimable, NULL::integer AS status, NULL::json AS headers, NULL::bytea AS body
      FROM ins
      UNION ALL
      SELECT false, fingerprint, completed_at_ms IS NOT NULL, lease_until_ms - n.ms,
        expires_at_ms <= n.ms OR (completed_at_ms IS NULL AND lease_until_ms <= n.ms AND fingerprint = $3),
        status, headers, body
      FROM ${qualified}, n
      WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM ins)`,
  };
  // A row is taken over when its retention has passed (a new operation), or when it is in progress
  // with a passed lease and the same fingerprint (a retry taking over a dead owner). The WHERE is
  // checked again under the row lock, so of concurrent takeovers exactly one wins.
  const TAKE_OVER = {
    name: `retrysafe_take_over_${tag}`,
    text: `WITH n AS (SELECT ${NOW_MS} AS ms)
      UPDATE ${qualified} SET fingerprint = $3, token = $4, lease_until_ms = n.ms + $5, created_at_ms = n.ms,
        expires_at_ms = n.ms + $6, completed_at_ms = NULL, status = NULL, headers = NULL,
        body = NULL,
        steps = CASE WHEN expires_at_ms <= n.ms THEN NULL ELSE steps END,
        request = CASE WHEN expires_at_ms <= n.ms THEN NULL ELSE request END
      FROM n
      WHERE scope = $1 AND key = $2
        AND (expires_at_ms <= n.ms OR (completed_at_ms IS NULL AND lease_until_ms <= n.ms AND fingerprint = $3))
      RETURNING steps`,
  };
  const LEASE_LEFT = {
    name: `retrysafe_lease_left_${tag}`,
    text: `SELECT lease_until_ms - n.ms AS lease_left_ms FROM ${qualified}, (SELECT ${NOW_MS} AS ms) n
      WHERE scope = $1 AND key = $2 AND completed_at_ms IS NULL AND lease_until_ms > n.ms
        AND expires_at_ms > n.ms`,
  };
  // The NOTIFY rides in the same statement.
  const COMPLETE = {
    name: `retrysafe_complete_${tag}`,
    text: `WITH n AS (SELECT ${NOW_MS} AS ms), done AS (
        UPDATE ${qualified} SET completed_at_ms = n.ms, status = $4, headers = $5, body = $6, request = NULL
        FROM n
        WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > n.ms
        RETURNING 1)
      SELECT pg_notify($7, $8) FROM done`,
  };
  // One write: the step is appended to the record's steps (a jsonb array keeps saving order).
  const SAVE_STEP = {
    name: `retrysafe_save_step_${tag}`,
    text: `UPDATE ${qualified}
      SET steps = coalesce(steps, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('name', $4::text, 'value', $5::text)),
        request = coalesce($6, request)
      WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > ${NOW_MS}`,
  };
  // The phase's lock: a takeover's UPDATE of this row waits until the phase commits or rolls back.
  const LOCK_OWNED = {
    name: `retrysafe_lock_owned_${tag}`,
    text: `SELECT token FROM ${qualified}
      WHERE scope = $1 AND key = $2 AND completed_at_ms IS NULL AND expires_at_ms > ${NOW_MS} FOR UPDATE`,
  };
  const ABANDONED = {
    name: `retrysafe_abandoned_${tag}`,
    text: `SELECT scope, key, fingerprint, request, lease_until_ms FROM ${qualified}, (SELECT ${NOW_MS} AS ms) n
      WHERE request IS NOT NULL AND completed_at_ms IS NULL AND lease_until_ms <= n.ms AND expires_at_ms > n.ms
      ORDER BY lease_until_ms LIMIT $1`,
  };
  // Names of their own: SQL PREPARE shares the namespace of the protocol-level statements `pg` prepares.
  const CLAIM_TYPES = ['text', 'text', 'text', 'text', 'bigint', 'bigint'];
  const ATOMIC = {
    claim: { name: `retrysafe_atomic_claim_${tag}`, text: CLAIM.text, types: CLAIM_TYPES },
    takeOver: { name: `retrysafe_atomic_take_over_${tag}`, text: TAKE_OVER.text, types: CLAIM_TYPES },
    // COMPLETE, sent with the COMMIT in one round trip. It divides by the number of rows it
    // completed, so a claim lost meanwhile (the work outlived the record) raises division_by_zero:
    // the transaction is aborted, and the COMMIT after it never runs. No NOTIFY: no other
    // transaction ever sees this record in progress, so no one waits on it, and a NOTIFY takes a
    // database-wide lock at commit that serialises every notifying commit (measured: a third of
    // the keyed desk's backends waiting on it under load).
    complete: {
      name: `retrysafe_atomic_complete_${tag}`,
      text: `WITH n AS (SELECT ${NOW_MS} AS ms), done AS (
          UPDATE ${qualified} SET completed_at_ms = n.ms, status = $4, headers = $5, body = $6 FROM n
          WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > n.ms
          RETURNING 1)
        SELECT 1 / count(*)::int FROM done`,
      types: ['text', 'text', 'text', 'integer', 'json', 'bytea'],
    },
  } satisfies Record<string, TypedStatement>;
  const ATOMIC_STATEMENTS = Object.values(ATOMIC);
  const RELEASE = {
    name: `retrysafe_release_${tag}`,
    text: `WITH gone AS (
        DELETE FROM ${qualified}
        WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL
          AND expires_at_ms > ${NOW_MS}
        RETURNING 1)
      SELECT pg_notify($4, $5) FROM gone`,
  };
  const DELETE = {
    name: `retrysafe_delete_${tag}`,
    text: `WITH gone AS (
        DELETE FROM ${qualified} WHERE scope = $1 AND key = $2 AND expires_at_ms > ${NOW_MS}
        RETURNING 1)
      SELECT pg_notify($3, $4) FROM gone`,
  };
  // Retention grows with the lease when the lease would outlive it, as at the claim.
  const RENEW = {
    name: `retrysafe_renew_${tag}`,
    text: `WITH n AS (SELECT ${NOW_MS} AS ms)
      UPDATE ${qualified} SET lease_until_ms = n.ms + $4, expires_at_ms = GREATEST(expires_at_ms, n.ms + $4)
      FROM n
      WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > n.ms`,
  };
  // SKIP LOCKED: rows a claim is taking over right now are left for the next purge.
  const PURGE = {
    name: `retrysafe_purge_${tag}`,
    text: `WITH n AS (SELECT ${NOW_MS} AS ms)
      DELETE FROM ${qualified} WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM ${qualified}, n
        WHERE expires_at_ms <= n.ms AND NOT (completed_at_ms IS NULL AND lease_until_ms > n.ms)
        LIMIT $1 FOR UPDATE SKIP LOCKED))`,
  };

  /** Runs one of the statements above on the pool, prepared by `pg` unless a transaction pooler is between. */
  function run<R extends pg.QueryResultRow>(statement: Statement, values: unknown[]) {
    return pool.query<R>(onClient(statement, values));
  }

  /** A statement's query config: unnamed behind a transaction pooler, which cannot keep it prepared. */
  function onClient(statement: Statement, values: unknown[]): pg.QueryConfig {
    return transactionPooling ? { text: statement.text, values } : { ...statement, values };
  }

  type ClaimValues = [string, string, string, string, number, number];
  /** Runs the claim (`take: false`) or the takeover statement. */
  type ClaimQuery = (take: boolean, values: ClaimValues) => Promise<pg.QueryResult<RecordRow>>;

  async function claimWith(query: ClaimQuery, input: ClaimInput): Promise<ClaimResult> {
    for (let attempt = 1; ; attempt++) {
      const token = randomUUID();
      const values: ClaimValues = [
        input.scope,
        input.key,
        input.fingerprint,
        token,
        input.leaseMs,
        input.retainMs,
      ];
      const { rows } = await query(false, values);
      const row = rows[0];
      if (row?.acquired) return { outcome: 'acquired', token };
      if (row && !row.claimable) {
        if (row.fingerprint !== input.fingerprint) return { outcome: 'mismatch' };
        if (row.completed) {
          return {
            outcome: 'replay',
            response: { status: row.status!, headers: row.headers ?? {}, body: row.body ?? Buffer.alloc(0) },
          };
        }
        return { outcome: 'in_progress', retryAfterMs: Math.max(0, Number(row.lease_left_ms)) };
      }
      const taken = row && (await query(true, values));
      if (taken && taken.rowCount === 1) {
        const steps = (taken.rows[0] as { steps?: SavedStep[] | null } | undefined)?.steps;
        return steps ? { outcome: 'acquired', token, steps } : { outcome: 'acquired', token };
      }
      if (attempt === CLAIM_ATTEMPTS) return { outcome: 'in_progress', retryAfterMs: 0 };
    }
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
    const statements = postgresMigrationSql({ schema, table });
    try {
      await client.query('BEGIN');
      // Two app servers migrating at once would otherwise race on CREATE … IF NOT EXISTS.
      await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`retrysafe_migrate_${qualified}`]);
      // CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege even when the schema exists.
      const { rowCount } = await client.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema]);
      for (const statement of statements) {
        if (rowCount === 0 || !statement.startsWith('CREATE SCHEMA')) await client.query(statement);
      }
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

  return {
    name: 'postgres',
    pool,

    migrate,

    claim(input) {
      return own(() => claimWith((take, values) => run<RecordRow>(take ? TAKE_OVER : CLAIM, values), input));
    },

    async complete(scope, key, token, response) {
      const { rowCount } = await own(() =>
        run(COMPLETE, [...completeValues(scope, key, token, response), channel, notifyId(scope, key)]),
      );
      return rowCount === 1;
    },

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
      const { limit, scope, after } = listRequest('postgresStore.list', options, 2);
      const values: (string | number)[] = [limit + 1];
      const where = ['expires_at_ms > n.ms'];
      if (scope !== undefined) where.push(`scope = $${values.push(scope)}`);
      // A row comparison: a range scan of the primary key, so a deep page costs no more than the first.
      if (after) where.push(`(scope, key) > ($${values.push(after[0]!)}, $${values.push(after[1]!)})`);
      const { rows } = await own(() =>
        pool.query<SummaryRow>(
          `SELECT ${SUMMARY_COLUMNS} FROM ${qualified}, (SELECT ${NOW_MS} AS ms) n
            WHERE ${where.join(' AND ')} ORDER BY scope, key LIMIT $1`,
          values,
        ),
      );
      return keysetPage(rows.map(summaryOf), limit);
    },

    async get(scope, key, options) {
      const columns = options?.response ? `${SUMMARY_COLUMNS}, ${RESPONSE_COLUMNS}` : SUMMARY_COLUMNS;
      const { rows } = await own(() =>
        pool.query<SummaryRow & ResponseRow>(
          `SELECT ${columns} FROM ${qualified} WHERE scope = $1 AND key = $2 AND expires_at_ms > ${NOW_MS}`,
          [scope, key],
        ),
      );
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
      let claimed: ClaimResult;
      try {
        claimed = await claimWith(query, input).catch(async (error) => {
          // DISCARD ALL or DEALLOCATE (the app, a pooler) dropped our statements: prepare again, once.
          if ((error as { code?: string }).code !== MISSING_PREPARED_STATEMENT) throw error;
          await client.query('ROLLBACK');
          preparedOn.delete(client);
          await prepare(client, ATOMIC_STATEMENTS, timeoutMs);
          begin = BEGIN;
          return claimWith(query, input);
        });
      } catch (error) {
        if ((error as { code?: string }).code !== LOCK_NOT_AVAILABLE) throw error;
        claimed = { outcome: 'in_progress', retryAfterMs: BLOCKED_RETRY_AFTER_MS };
      }
      if (claimed.outcome !== 'acquired') {
        // The claim wrote nothing: its ROLLBACK is sent and not waited for, so a replay answers
        // after one round trip, not two. The client goes back to the pool meanwhile; a pg client
        // runs its queries in order, so whoever takes it next queues behind the ROLLBACK, and a
        // connection lost in it is dropped by the pool.
        client.query('ROLLBACK').catch(() => undefined);
        return claimed;
      }
      const result = await work(client);
      if (!result.commit) {
        await client.query('ROLLBACK');
        return { outcome: 'executed', response: result.response, committed: false };
      }
      const values = completeValues(input.scope, input.key, claimed.token, result.response);
      try {
        await client.query(`${withValues(ATOMIC.complete, values, !transactionPooling)}; COMMIT`);
      } catch (error) {
        if ((error as { code?: string }).code !== DIVISION_BY_ZERO) throw error;
        throw new RetrysafeError('postgresStore: the atomic claim was lost before commit', { cause: error });
      }
      return { outcome: 'executed', response: result.response, committed: true };
    } catch (error) {
      if (!broken) {
        await client.query('ROLLBACK').catch((rollbackError: Error) => {
          broken ??= rollbackError;
        });
      }
      throw error;
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
