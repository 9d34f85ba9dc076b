import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError } from '../core/contract/index.js';
import { timerMs } from '../core/options/index.js';
import {
  type AbandonedOptions,
  type AbandonedRecord,
  type GetKeyOptions,
  type KeyPage,
  type KeyRecord,
  type KeyRecordSummary,
  type ListKeysOptions,
  MAX_LIST_LIMIT,
  type SavedStep,
} from '../core/store.js';

export const DEFAULT_PURGE_BATCH_SIZE = 1000;
export const DEFAULT_LIST_LIMIT = 100;

/** `list` options checked, with the cursor decoded into the strings {@link listCursor} encoded. */
export interface ListRequest {
  limit: number;
  scope: string | undefined;
  after: string[] | undefined;
}

/** An opaque `next` for `list`: the position the next page starts after. */
export function listCursor(position: readonly string[]): string {
  return Buffer.from(JSON.stringify(position)).toString('base64url');
}

/** Checks `list` options, naming `owner` in errors; `arity` is how many strings the store's cursors hold. */
export function listRequest(owner: string, options: ListKeysOptions, arity: number): ListRequest {
  const limit = abandonedLimit(owner, options);
  if (options.scope !== undefined && typeof options.scope !== 'string') {
    throw new ConfigError(`${owner}: \`scope\` must be a string`);
  }
  if (options.after === undefined) return { limit, scope: options.scope, after: undefined };
  let after: unknown;
  try {
    after = JSON.parse(Buffer.from(String(options.after), 'base64url').toString('utf8'));
  } catch {
    after = undefined;
  }
  if (!Array.isArray(after) || after.length !== arity || !after.every((part) => typeof part === 'string')) {
    throw new ConfigError(`${owner}: \`after\` is not a cursor this store returned`);
  }
  return { limit, scope: options.scope, after };
}

/** Checks `abandoned`'s `limit` (1 to MAX_LIST_LIMIT, default 100), naming `owner` in errors. */
export function abandonedLimit(owner: string, options: AbandonedOptions): number {
  const limit = requirePositiveInteger(owner, 'limit', options.limit ?? DEFAULT_LIST_LIMIT);
  if (limit > MAX_LIST_LIMIT) throw new ConfigError(`${owner}: \`limit\` must be at most ${MAX_LIST_LIMIT}`);
  return limit;
}

/** Length-prefixed so that no two (scope, key) pairs share an id, whatever characters they hold. */
export function recordId(scope: string, key: string): string {
  return `${scope.length}:${scope}${key}`;
}

/** The `(scope, key)` a {@link recordId} was made of; `undefined` for any other string. */
export function parseRecordId(id: string): { scope: string; key: string } | undefined {
  const match = /^(\d{1,10}):/.exec(id);
  if (!match) return undefined;
  const start = match[0].length;
  const end = start + Number(match[1]);
  return end <= id.length ? { scope: id.slice(start, end), key: id.slice(end) } : undefined;
}

export function newToken(): string {
  return randomUUID();
}

/**
 * A table or schema name safe to put into the SQL stores' statements: letters, digits and `_`, not starting with a digit, at most `maxLength` characters (PostgreSQL and SQLite take
 * 63, MySQL 64), so that no option can smuggle SQL in.
 */
export function sqlIdentifier(owner: string, option: string, value: unknown, maxLength = 63): string {
  const pattern = new RegExp(`^[A-Za-z_][A-Za-z0-9_]{0,${maxLength - 1}}$`);
  if (typeof value !== 'string' || !pattern.test(value)) {
    throw new ConfigError(`${owner}: \`${option}\` must match ${pattern} (got ${JSON.stringify(value)})`);
  }
  return value;
}

/** A response body as the drivers take it, without copying one that already is a `Buffer`. */
export function toBuffer(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

export function requirePositiveInteger(owner: string, option: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    throw new ConfigError(`${owner}: \`${option}\` must be a positive integer, got ${String(value)}`);
  }
  return value;
}

/**
 * A purge: `deleteBatch` deletes up to `batchSize` expired records and says how many, until a batch
 * comes back short. After each full batch it rests as long as the batch took, so a large purge
 * leaves the requests served meanwhile at least half of the event loop and of the database.
 */
export async function purgeInBatches(
  batchSize: number,
  deleteBatch: () => Promise<number>,
  rest: (ms: number) => Promise<unknown> = sleep,
  nowMs: () => number = () => performance.now(),
): Promise<number> {
  let deleted = 0;
  for (;;) {
    const startedMs = nowMs();
    const count = await deleteBatch();
    deleted += count;
    if (count < batchSize) return deleted;
    await rest(timerMs(Math.max(1, nowMs() - startedMs)));
  }
}

/**
 * A purge batch of `rows` records deleted as statements that each hold the event loop for about
 * `budgetMs` at most: a synchronous driver (SQLite) blocks every request while one runs, however
 * few rows it names. Each statement's row limit follows the last one's time (halved past the
 * budget, doubled under half of it, never above `rows`), and the event loop runs its queued
 * I/O (`pause`) between two statements, so a request waits one short statement, not a batch.
 * `deleteUpTo(limit)` deletes up to `limit` expired records and says how many.
 */
export function pacedDeletes(
  budgetMs: number,
  deleteUpTo: (limit: number) => Promise<number>,
  pause: () => Promise<unknown> = yieldToEventLoop,
  nowMs: () => number = () => performance.now(),
): (rows: number) => Promise<number> {
  let limit = 1;
  return async (rows) => {
    let deleted = 0;
    for (;;) {
      const asked = Math.min(limit, rows - deleted);
      const startedMs = nowMs();
      const count = await deleteUpTo(asked);
      const tookMs = nowMs() - startedMs;
      deleted += count;
      if (count < asked || deleted >= rows) return deleted;
      if (tookMs > budgetMs) limit = Math.max(1, Math.floor(limit / 2));
      else if (tookMs < budgetMs / 2) limit = Math.min(limit * 2, rows);
      await pause();
    }
  };
}

export function yieldToEventLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * In-process wake-ups for `wait`, keyed by record id. Every waiter removes itself when it is woken
 * or times out, so the map holds only waiters that are still pending.
 */
export class Waiters {
  readonly #byId = new Map<string, Set<() => void>>();

  /** Resolves on `wake(id)` or after `timeoutMs`, whichever comes first. */
  sleep(id: string, timeoutMs: number): Promise<void> {
    return new Promise((resolve) => {
      let set = this.#byId.get(id);
      if (!set) {
        set = new Set();
        this.#byId.set(id, set);
      }
      const waiters = set;
      const done = () => {
        clearTimeout(timer);
        waiters.delete(done);
        if (waiters.size === 0 && this.#byId.get(id) === waiters) this.#byId.delete(id);
        resolve();
      };
      const timer = setTimeout(done, timerMs(timeoutMs));
      waiters.add(done);
    });
  }

  wake(id: string): void {
    const set = this.#byId.get(id);
    if (!set) return;
    for (const done of [...set]) done();
  }

  wakeAll(): void {
    for (const id of [...this.#byId.keys()]) this.wake(id);
  }

  /** Pending waiters, all ids together. */
  get size(): number {
    let total = 0;
    for (const set of this.#byId.values()) total += set.size;
    return total;
  }
}

/** The columns the SQL stores keep of a record for the admin API (PostgreSQL gives bigints as strings). */
export interface SummaryRow {
  scope: string;
  key: string;
  status: number | null;
  created_at_ms: number | string;
  expires_at_ms: number | string;
  lease_until_ms: number | string;
  completed_at_ms: number | string | null;
  /** The saved steps: JSON text (SQLite) or parsed (PostgreSQL's jsonb); `null` when none. */
  steps: string | SavedStep[] | null;
}

export const SUMMARY_COLUMNS =
  'scope, key, status, created_at_ms, expires_at_ms, lease_until_ms, completed_at_ms, steps';

/** Saved steps as a SQL store returns its `steps` column. */
export function stepsOf(column: string | SavedStep[] | null): SavedStep[] {
  if (column === null) return [];
  return typeof column === 'string' ? (JSON.parse(column) as SavedStep[]) : column;
}

export function summaryOf(row: SummaryRow): KeyRecordSummary {
  const completed = row.completed_at_ms !== null;
  return {
    scope: row.scope,
    key: row.key,
    state: completed ? 'completed' : 'in_progress',
    status: completed ? row.status : null,
    createdAtMs: Number(row.created_at_ms),
    expiresAtMs: Number(row.expires_at_ms),
    leaseUntilMs: completed ? null : Number(row.lease_until_ms),
    ...(row.steps !== null && { steps: stepsOf(row.steps).map((step) => step.name) }),
  };
}

/** The columns a SQL store adds to its summary's for `get(…, { response: true })`. */
export const RESPONSE_COLUMNS = 'headers, body';

/** The response columns as the SQL drivers return them: headers as JSON text, or parsed (PostgreSQL's json). */
export interface ResponseRow {
  headers?: string | Record<string, string> | null;
  body?: Uint8Array | null;
}

/** `summary`, with the saved response of `row` when `options` asks for it and the record is completed. */
export function keyRecordOf(summary: KeyRecordSummary, row: ResponseRow, options?: GetKeyOptions): KeyRecord {
  if (!options?.response || summary.state !== 'completed') return summary;
  const { headers, body } = row;
  return {
    ...summary,
    response: {
      status: summary.status!,
      headers:
        typeof headers === 'string' ? (JSON.parse(headers) as Record<string, string>) : (headers ?? {}),
      body: body ? new Uint8Array(body.buffer, body.byteOffset, body.byteLength) : new Uint8Array(0),
    },
  };
}

/** A page of a keyset listing fetched with `LIMIT limit + 1`: the extra row only says there is more. */
export function keysetPage(rows: KeyRecordSummary[], limit: number): KeyPage {
  const records = rows.slice(0, limit);
  const last = records[records.length - 1];
  return { records, next: rows.length > limit && last ? listCursor([last.scope, last.key]) : null };
}

/** The columns `abandoned` reads in the SQL stores. */
export interface AbandonedRow {
  scope: string;
  key: string;
  fingerprint: string;
  request: string;
  lease_until_ms: number | string;
}

export function abandonedOf(row: AbandonedRow): AbandonedRecord {
  const { scope, key, fingerprint, request } = row;
  return { scope, key, fingerprint, request, leaseUntilMs: Number(row.lease_until_ms) };
}
