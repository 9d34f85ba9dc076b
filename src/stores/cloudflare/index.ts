import { RetrysafeError } from '../../core/contract/index.js';
import { checkOptions, optionNames } from '../../core/options/index.js';
import type {
  AbandonedOptions,
  ClaimInput,
  ClaimResult,
  GetKeyOptions,
  IdempotencyStore,
  KeyPage,
  KeyRecord,
  ListKeysOptions,
  SavedStep,
  StoredResponse,
} from '../../core/store.js';
import {
  type AbandonedRow,
  abandonedLimit,
  abandonedOf,
  DEFAULT_PURGE_BATCH_SIZE,
  keyRecordOf,
  keysetPage,
  listRequest,
  newToken,
  RESPONSE_COLUMNS,
  recordId,
  requirePositiveInteger,
  SUMMARY_COLUMNS,
  type SummaryRow,
  summaryOf,
  Waiters,
} from '../internal.js';
import { sqliteMigrationSql } from '../sqlite/migrate.js';

/** The part of a Durable Object's `ctx.storage.sql` the store uses (SQLite-backed objects only). */
export interface SqlStorageLike {
  exec(
    query: string,
    ...bindings: unknown[]
  ): {
    toArray(): Record<string, unknown>[];
    readonly rowsWritten: number;
  };
}

/** The part of a Durable Object's state (`ctx`) the store uses. */
export interface DurableObjectStateLike {
  storage: { sql: SqlStorageLike };
}

/** The part of a Durable Object namespace binding (`env.IDEMPOTENCY`) the client store uses. */
export interface DurableObjectNamespaceLike {
  idFromName(name: string): unknown;
  get(id: never): { fetch(input: string, init?: RequestInit): Promise<Response> };
}

/** Thrown by the client store when the Durable Object answers a call with an error. */
export class DurableObjectStoreError extends RetrysafeError {
  override readonly name = 'DurableObjectStoreError';
}

/** Matches a record the caller owns: live, not completed, its token. Binds scope, key, token, now. */
const OWNED = 'scope = ? AND key = ? AND token = ? AND completed_at_ms IS NULL AND expires_at_ms > ?';

/** A response as it crosses between the Worker and the object: the body in base64. */
interface WireResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

const toWire = (response: StoredResponse): WireResponse => ({
  status: response.status,
  headers: response.headers,
  body: Buffer.from(response.body.buffer, response.body.byteOffset, response.body.byteLength).toString(
    'base64',
  ),
});

const fromWire = (response: WireResponse): StoredResponse => ({
  status: response.status,
  headers: response.headers,
  body: new Uint8Array(Buffer.from(response.body, 'base64')),
});

/** SQLite blobs come back from `sql.exec` as ArrayBuffers. */
const bytesOf = (blob: unknown): Uint8Array =>
  blob instanceof ArrayBuffer ? new Uint8Array(blob) : ((blob as Uint8Array | null) ?? new Uint8Array(0));

/**
 * The records, kept in a Durable Object's own SQLite storage. Every call is a run of synchronous
 * `sql.exec` statements with no `await` between its read and its write, and the object runs one
 * event at a time: a claim is atomic without a transaction. `Date.now()` is the object's clock,
 * one clock for every Worker that calls it.
 */
class DurableRecords {
  readonly #sql: SqlStorageLike;
  readonly #waiters = new Waiters();

  constructor(sql: SqlStorageLike) {
    this.#sql = sql;
    // The SQLite store's own table: one schema for SQLite wherever it runs.
    for (const statement of sqliteMigrationSql()) this.#sql.exec(statement);
  }

  #rows(query: string, ...bindings: unknown[]): Record<string, unknown>[] {
    return this.#sql.exec(query, ...bindings).toArray();
  }

  #written(query: string, ...bindings: unknown[]): boolean {
    return this.#sql.exec(query, ...bindings).rowsWritten > 0;
  }

  claim(input: ClaimInput) {
    const nowMs = Date.now();
    const { scope, key } = input;
    this.#sql.exec(
      'DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND expires_at_ms <= ?',
      scope,
      key,
      nowMs,
    );
    const [row] = this.#rows(
      'SELECT fingerprint, lease_until_ms, completed_at_ms, status, headers, body, steps FROM idempotency_keys WHERE scope = ? AND key = ?',
      scope,
      key,
    );
    const token = newToken();
    const leaseUntilMs = nowMs + input.leaseMs;
    if (!row) {
      this.#sql.exec(
        'INSERT INTO idempotency_keys (scope, key, fingerprint, token, created_at_ms, lease_until_ms, expires_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)',
        scope,
        key,
        input.fingerprint,
        token,
        nowMs,
        leaseUntilMs,
        nowMs + input.retainMs,
      );
      return { outcome: 'acquired', token };
    }
    if (row.fingerprint !== input.fingerprint) return { outcome: 'mismatch' };
    if (row.completed_at_ms !== null) {
      const response = {
        status: row.status as number,
        headers: JSON.parse(row.headers as string),
        body: bytesOf(row.body),
      };
      return { outcome: 'replay', response: toWire(response) };
    }
    if ((row.lease_until_ms as number) > nowMs) {
      return { outcome: 'in_progress', retryAfterMs: (row.lease_until_ms as number) - nowMs };
    }
    // A takeover goes on with the same operation: retention counts from the first claim, but never
    // ends inside the new lease.
    this.#sql.exec(
      'UPDATE idempotency_keys SET token = ?, lease_until_ms = ?, expires_at_ms = max(expires_at_ms, ?) WHERE scope = ? AND key = ?',
      token,
      leaseUntilMs,
      leaseUntilMs,
      scope,
      key,
    );
    const steps = row.steps === null ? [] : (JSON.parse(row.steps as string) as SavedStep[]);
    return { outcome: 'acquired', token, steps };
  }

  complete(scope: string, key: string, token: string, response: WireResponse) {
    const { status, headers, body } = fromWire(response);
    const nowMs = Date.now();
    const done = this.#written(
      `UPDATE idempotency_keys SET completed_at_ms = ?, status = ?, headers = ?, body = ? WHERE ${OWNED}`,
      nowMs,
      status,
      JSON.stringify(headers),
      body,
      scope,
      key,
      token,
      nowMs,
    );
    if (done) this.#waiters.wake(recordId(scope, key));
    return done;
  }

  release(scope: string, key: string, token: string) {
    const done = this.#written(`DELETE FROM idempotency_keys WHERE ${OWNED}`, scope, key, token, Date.now());
    if (done) this.#waiters.wake(recordId(scope, key));
    return done;
  }

  renew(scope: string, key: string, token: string, leaseMs: number) {
    const nowMs = Date.now();
    return this.#written(
      `UPDATE idempotency_keys SET lease_until_ms = ?, expires_at_ms = max(expires_at_ms, ?) WHERE ${OWNED}`,
      nowMs + leaseMs,
      nowMs + leaseMs,
      scope,
      key,
      token,
      nowMs,
    );
  }

  saveStep(scope: string, key: string, token: string, step: SavedStep, request?: string) {
    return this.#written(
      `UPDATE idempotency_keys SET steps = json_insert(coalesce(steps, '[]'), '$[#]', json(?)),
         request = coalesce(?, request) WHERE ${OWNED}`,
      JSON.stringify({ name: step.name, value: step.value }),
      request ?? null,
      scope,
      key,
      token,
      Date.now(),
    );
  }

  abandoned(limit: number) {
    const nowMs = Date.now();
    return this.#rows(
      `SELECT scope, key, fingerprint, request, lease_until_ms FROM idempotency_keys
       WHERE completed_at_ms IS NULL AND request IS NOT NULL AND lease_until_ms <= ? AND expires_at_ms > ?
       ORDER BY lease_until_ms LIMIT ?`,
      nowMs,
      nowMs,
      limit,
    ).map((row) => abandonedOf(row as unknown as AbandonedRow));
  }

  /** Resolves when the record leaves `in_progress`, or after `timeoutMs`: woken by this object's own writes. */
  async wait(scope: string, key: string, timeoutMs: number) {
    const id = recordId(scope, key);
    const deadlineMs = Date.now() + timeoutMs;
    for (;;) {
      const nowMs = Date.now();
      const [row] = this.#rows(
        'SELECT lease_until_ms FROM idempotency_keys WHERE scope = ? AND key = ? AND completed_at_ms IS NULL AND expires_at_ms > ?',
        scope,
        key,
        nowMs,
      );
      const leaseUntilMs = row?.lease_until_ms as number | undefined;
      if (leaseUntilMs === undefined || leaseUntilMs <= nowMs || nowMs >= deadlineMs) return null;
      await this.#waiters.sleep(id, Math.min(deadlineMs, leaseUntilMs) - nowMs);
    }
  }

  /** Deletes in batches of `batchSize` rows; a record expires no earlier than its lease, so none live is touched. */
  purgeExpired(batchSize: number) {
    const nowMs = Date.now();
    let deleted = 0;
    for (;;) {
      const { rowsWritten } = this.#sql.exec(
        'DELETE FROM idempotency_keys WHERE rowid IN (SELECT rowid FROM idempotency_keys WHERE expires_at_ms <= ? LIMIT ?)',
        nowMs,
        batchSize,
      );
      deleted += rowsWritten;
      if (rowsWritten < batchSize) return deleted;
    }
  }

  list(limit: number, scope: string | null, after: string[] | null) {
    const rows = this.#rows(
      `SELECT ${SUMMARY_COLUMNS} FROM idempotency_keys
       WHERE expires_at_ms > ?1 AND (?2 IS NULL OR scope = ?2) AND (?3 IS NULL OR (scope, key) > (?3, ?4))
       ORDER BY scope, key LIMIT ?5`,
      Date.now(),
      scope,
      after?.[0] ?? null,
      after?.[1] ?? null,
      limit + 1,
    );
    return keysetPage(
      rows.map((row) => summaryOf(row as unknown as SummaryRow)),
      limit,
    );
  }

  get(scope: string, key: string, options?: GetKeyOptions) {
    const [row] = this.#rows(
      `SELECT ${SUMMARY_COLUMNS}, ${RESPONSE_COLUMNS} FROM idempotency_keys WHERE scope = ? AND key = ? AND expires_at_ms > ?`,
      scope,
      key,
      Date.now(),
    );
    if (!row) return null;
    const record = keyRecordOf(
      summaryOf(row as unknown as SummaryRow),
      { headers: row.headers as string | null, body: bytesOf(row.body) },
      options,
    );
    return record.response ? { ...record, response: toWire(record.response) } : record;
  }

  delete(scope: string, key: string) {
    const done = this.#written(
      'DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND expires_at_ms > ?',
      scope,
      key,
      Date.now(),
    );
    if (done) this.#waiters.wake(recordId(scope, key));
    return done;
  }
}

type Operation = keyof DurableRecords;

/**
 * The Durable Object that holds the idempotency records: export it from your Worker's entry module
 * and bind it as a SQLite-backed class (`new_sqlite_classes` in your wrangler migrations). Its
 * `fetch` answers {@link durableObjectStore}'s calls; nothing else should call it.
 * @example
 * // worker.js
 * export { IdempotencyObject } from 'retrysafe/cloudflare';
 * // wrangler.jsonc
 * // "durable_objects": { "bindings": [{ "name": "IDEMPOTENCY", "class_name": "IdempotencyObject" }] },
 * // "migrations": [{ "tag": "v1", "new_sqlite_classes": ["IdempotencyObject"] }]
 */
export class IdempotencyObject {
  readonly #records: DurableRecords;

  constructor(state: DurableObjectStateLike, _env?: unknown) {
    this.#records = new DurableRecords(state.storage.sql);
  }

  async fetch(request: Request): Promise<Response> {
    const { op, args } = (await request.json()) as { op: Operation; args: unknown[] };
    const method = this.#records[op] as ((...args: unknown[]) => unknown) | undefined;
    if (typeof method !== 'function')
      return Response.json({ error: `unknown operation ${op}` }, { status: 400 });
    try {
      return Response.json({ result: (await method.apply(this.#records, args)) ?? null });
    } catch (error) {
      return Response.json({ error: (error as Error).message }, { status: 500 });
    }
  }
}

/** Options of {@link durableObjectStore}. */
export interface DurableObjectStoreOptions {
  /** The Durable Object namespace binding of {@link IdempotencyObject} (`env.IDEMPOTENCY`). */
  namespace: DurableObjectNamespaceLike;
  /**
   * The name of the one object that holds the records (`namespace.idFromName(name)`). Every Worker
   * naming it, in every location, shares the records.
   * @default 'retrysafe'
   * @example name: 'orders-idempotency'
   */
  name?: string;
}

const OPTION_NAMES = optionNames<DurableObjectStoreOptions>({ namespace: true, name: true });

/**
 * An idempotency store on a Cloudflare Durable Object: one instance worldwide, running one event at
 * a time over its own SQLite storage, so of N concurrent claims of one key, from any location,
 * exactly one is acquired. Each call is one `fetch` to the object ({@link IdempotencyObject}).
 * Needs the `nodejs_compat` compatibility flag (retrysafe hashes with `node:crypto`).
 * @example
 * import { durableObjectStore } from 'retrysafe/cloudflare';
 * const store = durableObjectStore({ namespace: env.IDEMPOTENCY });
 */
export function durableObjectStore(given: DurableObjectStoreOptions): IdempotencyStore {
  const options = checkOptions('durableObjectStore()', given, OPTION_NAMES);
  const { namespace } = options;
  if (typeof namespace?.idFromName !== 'function' || typeof namespace.get !== 'function') {
    throw new TypeError('durableObjectStore(): `namespace` must be a Durable Object namespace binding');
  }
  const name = options.name ?? 'retrysafe';
  if (typeof name !== 'string' || name === '') {
    throw new TypeError('durableObjectStore(): `name` must be a non-empty string');
  }
  const id = namespace.idFromName(name);

  // A stub per call: in workerd a stub belongs to the request that made it.
  async function call<T>(op: Operation, ...args: unknown[]): Promise<T> {
    const answer = await namespace.get(id as never).fetch('https://retrysafe.internal/', {
      method: 'POST',
      body: JSON.stringify({ op, args }),
    });
    const { result, error } = (await answer.json()) as { result?: T; error?: string };
    if (error !== undefined) throw new DurableObjectStoreError(`durableObjectStore: ${error}`);
    return result as T;
  }

  return {
    name: 'durable-object',
    async claim(input) {
      const result = await call<ClaimResult & { response?: WireResponse }>('claim', input);
      return result.outcome === 'replay'
        ? { outcome: 'replay', response: fromWire(result.response as never) }
        : result;
    },
    complete: (scope, key, token, response) => call('complete', scope, key, token, toWire(response)),
    release: (scope, key, token) => call('release', scope, key, token),
    renew: (scope, key, token, leaseMs) => call('renew', scope, key, token, leaseMs),
    saveStep: (scope, key, token, step, request) => call('saveStep', scope, key, token, step, request),
    abandoned: async (options: AbandonedOptions = {}) =>
      call('abandoned', abandonedLimit('durableObjectStore.abandoned', options)),
    wait: async (scope, key, timeoutMs) => void (await call('wait', scope, key, timeoutMs)),
    purgeExpired: async (batchSize = DEFAULT_PURGE_BATCH_SIZE) =>
      call('purgeExpired', requirePositiveInteger('durableObjectStore.purgeExpired', 'batchSize', batchSize)),
    async list(options: ListKeysOptions = {}): Promise<KeyPage> {
      const { limit, scope, after } = listRequest('durableObjectStore.list', options, 2);
      return call('list', limit, scope ?? null, after ?? null);
    },
    async get(scope, key, options) {
      const record = await call<(KeyRecord & { response?: WireResponse }) | null>('get', scope, key, options);
      if (!record) return undefined;
      return record.response ? { ...record, response: fromWire(record.response) } : record;
    },
    delete: (scope, key) => call('delete', scope, key),
    // The records live in the object; the client holds nothing open.
    close: async () => {},
  };
}
