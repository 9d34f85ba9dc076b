import type { ClaimInput, ClaimResult } from '../../core/store.js';
import { RESPONSE_COLUMNS, SUMMARY_COLUMNS, stepsOf } from '../internal.js';

/**
 * The SQLite store's SQL texts, built once per table (`t`, the quoted table name), shared by the
 * `sqlite` store and the SQL store's SQLite dialect. Positional `?` parameters: binding them costs
 * a fraction of looking up named ones in an object. Times are the caller's clock (`nowMs`), in ms
 * since the epoch: SQLite runs in this process, and tests move that clock to age keys.
 */
export function sqliteStatements(t: string) {
  // A row takes a new claim when its retention has passed (a new operation), or when it is in
  // progress with a passed lease and the same fingerprint (a retry taking over a dead owner). A
  // takeover goes on with the same operation: its created_at_ms and retention stay the first
  // claim's (so one that keeps failing still ends), never expiring inside the new lease.
  // Parameters: claimParameters().
  const CLAIM = `
    INSERT INTO ${t} (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
    VALUES (?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (scope, key) DO UPDATE SET
      fingerprint = excluded.fingerprint, token = excluded.token,
      lease_until_ms = excluded.lease_until_ms,
      created_at_ms = CASE WHEN ${t}.expires_at_ms <= ? THEN excluded.created_at_ms ELSE ${t}.created_at_ms END,
      expires_at_ms = CASE WHEN ${t}.expires_at_ms <= ? THEN excluded.expires_at_ms
        ELSE max(${t}.expires_at_ms, excluded.lease_until_ms) END,
      completed_at_ms = NULL, status = NULL, headers = NULL, body = NULL,
      steps = CASE WHEN ${t}.expires_at_ms <= ? THEN NULL ELSE ${t}.steps END,
      request = CASE WHEN ${t}.expires_at_ms <= ? THEN NULL ELSE ${t}.request END
    WHERE ${t}.expires_at_ms <= ?
      OR (${t}.completed_at_ms IS NULL AND ${t}.lease_until_ms <= ?
          AND ${t}.fingerprint = excluded.fingerprint)
    RETURNING token, steps`;
  const KEY = 'scope = ? AND key = ?';
  /** Live: (scope, key, nowMs). */
  const LIVE = `${KEY} AND expires_at_ms > ?`;
  // Fenced by the token: a request whose lease was taken over matches no row.
  /** Owned: (scope, key, token, nowMs). */
  const OWNED = `${KEY} AND token = ? AND completed_at_ms IS NULL AND expires_at_ms > ?`;
  const list = (byScope: boolean, after: 'none' | 'key' | 'row') => {
    const where = ['expires_at_ms > ?'];
    if (byScope) where.push('scope = ?');
    // Within one scope `key > ?` rather than the row value: SQLite's planner then ranges over
    // both columns of the key instead of scanning the scope from its start.
    if (after === 'key') where.push('key > ?');
    if (after === 'row') where.push('(scope, key) > (?, ?)');
    return `SELECT ${SUMMARY_COLUMNS} FROM ${t} WHERE ${where.join(' AND ')} ORDER BY scope, key LIMIT ?`;
  };
  return {
    CLAIM,
    /** What a claim met: (scope, key). */
    RECORD: `SELECT fingerprint, lease_until_ms, expires_at_ms, completed_at_ms, status, headers, body
      FROM ${t} WHERE ${KEY}`,
    /** The owner of a live record in progress: (scope, key, nowMs). */
    OWNER: `SELECT token FROM ${t} WHERE ${LIVE} AND completed_at_ms IS NULL`,
    /** A live record in progress, its lease left: (nowMs, scope, key, nowMs, nowMs). */
    LEASE_LEFT: `SELECT lease_until_ms - ? AS lease_left_ms FROM ${t}
      WHERE ${LIVE} AND completed_at_ms IS NULL AND lease_until_ms > ?`,
    // The saved request goes: a completed operation needs no completer.
    /** (nowMs, status, headers, body, ...OWNED). */
    COMPLETE: `UPDATE ${t} SET completed_at_ms = ?, status = ?, headers = ?, body = ?, request = NULL
      WHERE ${OWNED}`,
    /** (name, value, request, ...OWNED). */
    SAVE_STEP: `UPDATE ${t}
      SET steps = json_insert(coalesce(steps, '[]'), '$[#]', json_object('name', ?, 'value', ?)),
        request = coalesce(?, request)
      WHERE ${OWNED}`,
    /** (nowMs, nowMs, limit). */
    ABANDONED: `SELECT scope, key, fingerprint, request, lease_until_ms FROM ${t}
      WHERE request IS NOT NULL AND completed_at_ms IS NULL AND lease_until_ms <= ? AND expires_at_ms > ?
      ORDER BY lease_until_ms LIMIT ?`,
    /** (...OWNED). */
    RELEASE: `DELETE FROM ${t} WHERE ${OWNED}`,
    // Retention grows with the lease when the lease would outlive it: a record outlives its lease.
    /** (leaseUntilMs, leaseUntilMs, ...OWNED). */
    RENEW: `UPDATE ${t} SET lease_until_ms = ?, expires_at_ms = max(expires_at_ms, ?) WHERE ${OWNED}`,
    // A record never expires before its lease passes (the claim's `retainMs` covers the lease, and
    // renewals extend it), so this spares live leases.
    /** (nowMs, batchSize). */
    PURGE: `DELETE FROM ${t} WHERE rowid IN (SELECT rowid FROM ${t} WHERE expires_at_ms <= ? LIMIT ?)`,
    /** (...LIVE). */
    GET: `SELECT ${SUMMARY_COLUMNS} FROM ${t} WHERE ${LIVE}`,
    /** (...LIVE). */
    GET_WITH_RESPONSE: `SELECT ${SUMMARY_COLUMNS}, ${RESPONSE_COLUMNS} FROM ${t} WHERE ${LIVE}`,
    /** (...LIVE). */
    DELETE: `DELETE FROM ${t} WHERE ${LIVE}`,
    /** One statement per shape, each a range scan of the primary key: (nowMs, [scope], [afterScope], [afterKey], limit). */
    list,
  };
}

/** The parameters of CLAIM for `input`, claiming with `token` at `nowMs`. */
export function claimParameters(input: ClaimInput, token: string, nowMs: number): unknown[] {
  return [
    input.scope,
    input.key,
    input.fingerprint,
    token,
    nowMs + input.leaseMs,
    nowMs,
    nowMs + input.retainMs,
    nowMs,
    nowMs,
    nowMs,
    nowMs,
    nowMs,
    nowMs,
  ];
}

/** The parameters of a `list` page, in the order its statement names them. */
export function listParameters(
  nowMs: number,
  limit: number,
  scope: string | undefined,
  after: 'none' | 'key' | 'row',
  afterKeys: readonly string[] | undefined,
): unknown[] {
  const parameters: unknown[] = [nowMs];
  if (scope !== undefined) parameters.push(scope);
  if (after === 'row') parameters.push(afterKeys![0], afterKeys![1]);
  if (after === 'key') parameters.push(afterKeys![1]);
  parameters.push(limit + 1);
  return parameters;
}

/** Which `list` statement a page needs: by scope or not, and after nothing, a key of the scope, or a row. */
export function listShape(scope: string | undefined, after: readonly string[] | undefined) {
  return !after ? 'none' : scope !== undefined && after[0] === scope ? 'key' : 'row';
}

/** A row of RECORD. */
export interface RecordRow {
  fingerprint: string;
  lease_until_ms: number;
  expires_at_ms: number;
  completed_at_ms: number | null;
  status: number | null;
  headers: string | null;
  body: Uint8Array | null;
}

/** A claim that found a record it could not take. */
export type Settled = Exclude<ClaimResult, { outcome: 'acquired' }>;

/** What CLAIM's RETURNING row says: acquired when it carries our token, else `undefined`. */
export function acquiredOf(
  row: { token: string; steps: string | null } | undefined,
  token: string,
): ClaimResult | undefined {
  if (row?.token !== token) return undefined;
  return row.steps === null
    ? { outcome: 'acquired', token }
    : { outcome: 'acquired', token, steps: stepsOf(row.steps) };
}

/** Whether a claim at `nowMs` would take `row` (CLAIM's WHERE, in JS). */
export function claimable(row: RecordRow, input: ClaimInput, nowMs: number): boolean {
  return (
    row.expires_at_ms <= nowMs ||
    (row.completed_at_ms === null && row.lease_until_ms <= nowMs && row.fingerprint === input.fingerprint)
  );
}

/** What a claim gets from a record it could not take. */
export function settledOf(row: RecordRow, input: ClaimInput, nowMs: number): Settled {
  if (row.fingerprint !== input.fingerprint) return { outcome: 'mismatch' };
  if (row.completed_at_ms === null) {
    return { outcome: 'in_progress', retryAfterMs: Math.max(1, row.lease_until_ms - nowMs) };
  }
  const body = row.body!;
  return {
    outcome: 'replay',
    response: {
      status: row.status!,
      headers: JSON.parse(row.headers!) as Record<string, string>,
      body: new Uint8Array(body.buffer, body.byteOffset, body.byteLength),
    },
  };
}

/** A completed live record answers a retry without the write lock: it never changes until it expires. */
export function completedOf(row: RecordRow | undefined, input: ClaimInput, nowMs: number) {
  if (!row || row.completed_at_ms === null || row.expires_at_ms <= nowMs) return undefined;
  return settledOf(row, input, nowMs);
}
