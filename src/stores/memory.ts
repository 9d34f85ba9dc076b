import { RetrysafeError } from '../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../core/options/index.js';
import type {
  AbandonedOptions,
  AbandonedRecord,
  ClaimInput,
  ClaimResult,
  GetKeyOptions,
  IdempotencyStore,
  KeyPage,
  KeyRecordSummary,
  ListKeysOptions,
  SavedStep,
  StoredResponse,
} from '../core/store.js';
import {
  abandonedLimit,
  DEFAULT_PURGE_BATCH_SIZE,
  keyRecordOf,
  keysetPage,
  listRequest,
  newToken,
  recordId,
  requirePositiveInteger,
  Waiters,
  yieldToEventLoop,
} from './internal.js';

/** Options of {@link memoryStore}. */
export interface MemoryStoreOptions {
  /**
   * The most records kept at once. When full, the records completed longest ago are evicted first
   * (a retry of an evicted key runs again); an in-progress record is never evicted, and a claim
   * that finds only in-progress records throws {@link MemoryStoreFullError}.
   * @default 100_000
   * @example maxRecords: 10_000
   */
  maxRecords?: number;
  /**
   * How often a timer removes records whose retention has passed. The timer is `unref`'d and
   * stopped by `close()`; expired records also read as absent before it runs.
   * @default 60_000
   * @example sweepIntervalMs: 5_000
   */
  sweepIntervalMs?: number;
}

/** Thrown by `claim` when the store holds `maxRecords` records and every one is in progress. */
export class MemoryStoreFullError extends RetrysafeError {
  override readonly name = 'MemoryStoreFullError';
}

interface MemoryRecord {
  scope: string;
  key: string;
  fingerprint: string;
  createdAtMs: number;
  token: string;
  leaseUntilMs: number;
  expiresAtMs: number;
  /** Absent while in progress. */
  response?: StoredResponse;
  /** The operation's finished steps, in saving order. */
  steps: SavedStep[];
  /** Saved with the first step, for the completer. */
  request?: string;
}

/**
 * The store's own copy of a response, kept until the record goes. The body gets a buffer of its
 * own size: a slice of Node's shared pool would keep a whole 8 KiB pool chunk alive per record.
 * Replays answer this copy itself; nothing in retrysafe writes to a response it replays.
 */
function keptCopy(response: StoredResponse): StoredResponse {
  const body = Buffer.allocUnsafeSlow(response.body.byteLength);
  body.set(response.body);
  return { status: response.status, headers: { ...response.headers }, body };
}

const OPTION_NAMES = optionNames<MemoryStoreOptions>({ maxRecords: true, sweepIntervalMs: true });

/**
 * An idempotency store in this process's memory: for tests and single-process services. Records
 * are lost on restart and not shared between processes (use `retrysafe/sqlite` for that).
 *
 * @example
 * ```ts
 * import { memoryStore } from 'retrysafe/memory';
 * const store = memoryStore({ maxRecords: 10_000 });
 * ```
 */
export function memoryStore(given?: MemoryStoreOptions): IdempotencyStore {
  const options = checkOptions('memoryStore()', given, OPTION_NAMES);
  const maxRecords = requirePositiveInteger('memoryStore', 'maxRecords', options.maxRecords ?? 100_000);
  const sweepIntervalMs = requirePositiveInteger(
    'memoryStore',
    'sweepIntervalMs',
    options.sweepIntervalMs ?? 60_000,
  );

  const records = new Map<string, MemoryRecord>();
  // Ids of completed records in completion order: the eviction queue, oldest first.
  const completed = new Set<string>();
  const waiters = new Waiters();
  let closed = false;

  function remove(id: string): void {
    records.delete(id);
    completed.delete(id);
  }

  function live(id: string, nowMs: number): MemoryRecord | undefined {
    const record = records.get(id);
    if (record && record.expiresAtMs <= nowMs) {
      remove(id);
      return undefined;
    }
    return record;
  }

  function removeExpired(nowMs: number): void {
    for (const [id, record] of records) if (record.expiresAtMs <= nowMs) remove(id);
  }

  function makeRoom(nowMs: number): void {
    if (records.size < maxRecords) return;
    const oldestCompleted = completed.values().next();
    if (!oldestCompleted.done) {
      remove(oldestCompleted.value);
      return;
    }
    removeExpired(nowMs);
    if (records.size >= maxRecords) {
      throw new MemoryStoreFullError(
        `memoryStore: all ${maxRecords} records (\`maxRecords\`) are in progress; refusing to evict one`,
      );
    }
  }

  async function claim(input: ClaimInput): Promise<ClaimResult> {
    const nowMs = Date.now();
    const id = recordId(input.scope, input.key);
    const existing = live(id, nowMs);
    if (existing) {
      if (existing.fingerprint !== input.fingerprint) return { outcome: 'mismatch' };
      if (existing.response) return { outcome: 'replay', response: existing.response };
      if (existing.leaseUntilMs > nowMs) {
        return { outcome: 'in_progress', retryAfterMs: existing.leaseUntilMs - nowMs };
      }
      // A takeover goes on with the same operation: its retention counts from its first claim, so
      // one that keeps failing still ends. Never expiring inside the new lease, though.
      existing.token = newToken();
      existing.leaseUntilMs = nowMs + input.leaseMs;
      existing.expiresAtMs = Math.max(existing.expiresAtMs, existing.leaseUntilMs);
      return { outcome: 'acquired', token: existing.token, steps: [...existing.steps] };
    }
    makeRoom(nowMs);
    const token = newToken();
    records.set(id, {
      scope: input.scope,
      key: input.key,
      fingerprint: input.fingerprint,
      createdAtMs: nowMs,
      token,
      leaseUntilMs: nowMs + input.leaseMs,
      expiresAtMs: nowMs + input.retainMs,
      steps: [],
    });
    return { outcome: 'acquired', token };
  }

  function owned(id: string, token: string): MemoryRecord | undefined {
    const record = live(id, Date.now());
    return record && !record.response && record.token === token ? record : undefined;
  }

  async function complete(scope: string, key: string, token: string, response: StoredResponse) {
    const id = recordId(scope, key);
    const record = owned(id, token);
    if (!record) return false;
    record.response = keptCopy(response);
    completed.add(id);
    waiters.wake(id);
    return true;
  }

  async function saveStep(scope: string, key: string, token: string, step: SavedStep, request?: string) {
    const record = owned(recordId(scope, key), token);
    if (!record) return false;
    record.steps.push({ name: step.name, value: step.value });
    if (request !== undefined) record.request = request;
    return true;
  }

  async function abandoned(options: AbandonedOptions = {}): Promise<AbandonedRecord[]> {
    const limit = abandonedLimit('memoryStore.abandoned', options);
    const nowMs = Date.now();
    return [...records.values()]
      .filter(
        (record): record is MemoryRecord & { request: string } =>
          !record.response &&
          record.request !== undefined &&
          record.leaseUntilMs <= nowMs &&
          record.expiresAtMs > nowMs,
      )
      .sort((a, b) => a.leaseUntilMs - b.leaseUntilMs)
      .slice(0, limit)
      .map(({ scope, key, fingerprint, request, leaseUntilMs }) => ({
        scope,
        key,
        fingerprint,
        request,
        leaseUntilMs,
      }));
  }

  async function release(scope: string, key: string, token: string) {
    const id = recordId(scope, key);
    if (!owned(id, token)) return false;
    remove(id);
    waiters.wake(id);
    return true;
  }

  async function renew(scope: string, key: string, token: string, leaseMs: number) {
    const record = owned(recordId(scope, key), token);
    if (!record) return false;
    const nowMs = Date.now();
    record.leaseUntilMs = nowMs + leaseMs;
    record.expiresAtMs = Math.max(record.expiresAtMs, record.leaseUntilMs);
    return true;
  }

  async function wait(scope: string, key: string, timeoutMs: number) {
    const id = recordId(scope, key);
    const deadlineMs = Date.now() + timeoutMs;
    for (;;) {
      const nowMs = Date.now();
      const record = live(id, nowMs);
      if (closed || !record || record.response || record.leaseUntilMs <= nowMs || nowMs >= deadlineMs) return;
      await waiters.sleep(id, Math.min(deadlineMs, record.leaseUntilMs) - nowMs);
    }
  }

  async function purgeExpired(batchSize = DEFAULT_PURGE_BATCH_SIZE) {
    requirePositiveInteger('memoryStore.purgeExpired', 'batchSize', batchSize);
    const nowMs = Date.now();
    let deleted = 0;
    for (const [id, record] of records) {
      if (record.expiresAtMs > nowMs) continue;
      remove(id);
      deleted++;
      if (deleted % batchSize === 0) await yieldToEventLoop();
    }
    return deleted;
  }

  function summary(record: MemoryRecord): KeyRecordSummary {
    return {
      scope: record.scope,
      key: record.key,
      state: record.response ? 'completed' : 'in_progress',
      status: record.response?.status ?? null,
      createdAtMs: record.createdAtMs,
      expiresAtMs: record.expiresAtMs,
      leaseUntilMs: record.response ? null : record.leaseUntilMs,
      ...(record.steps.length > 0 && { steps: record.steps.map((step) => step.name) }),
    };
  }

  const byScopeThenKey = (a: Pick<MemoryRecord, 'scope' | 'key'>, b: Pick<MemoryRecord, 'scope' | 'key'>) =>
    a.scope < b.scope ? -1 : a.scope > b.scope ? 1 : a.key < b.key ? -1 : a.key > b.key ? 1 : 0;

  async function list(options: ListKeysOptions = {}): Promise<KeyPage> {
    const { limit, scope, after } = listRequest('memoryStore.list', options, 2);
    const nowMs = Date.now();
    const start = after && { scope: after[0]!, key: after[1]! };
    const page = [...records.values()]
      .filter(
        (record) =>
          record.expiresAtMs > nowMs &&
          (scope === undefined || record.scope === scope) &&
          (!start || byScopeThenKey(record, start) > 0),
      )
      .sort(byScopeThenKey)
      .slice(0, limit + 1);
    return keysetPage(page.map(summary), limit);
  }

  async function get(scope: string, key: string, options?: GetKeyOptions) {
    const record = live(recordId(scope, key), Date.now());
    return record && keyRecordOf(summary(record), record.response ?? {}, options);
  }

  async function deleteRecord(scope: string, key: string) {
    const id = recordId(scope, key);
    if (!live(id, Date.now())) return false;
    remove(id);
    waiters.wake(id);
    return true;
  }

  const sweeper = setInterval(() => void purgeExpired(), timerMs(sweepIntervalMs));
  sweeper.unref();

  async function close() {
    closed = true;
    clearInterval(sweeper);
    waiters.wakeAll();
  }

  return {
    name: 'memory',
    claim,
    complete,
    release,
    saveStep,
    abandoned,
    renew,
    wait,
    purgeExpired,
    list,
    get,
    delete: deleteRecord,
    close,
  };
}
