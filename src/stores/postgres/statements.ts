import { randomUUID } from 'node:crypto';
import type { ClaimInput, ClaimResult, SavedStep } from '../../core/store.js';
import { RESPONSE_COLUMNS, SUMMARY_COLUMNS, stepsOf } from '../internal.js';

/** Now on the database server's clock, in ms: every time a store compares comes from it. */
export const NOW_MS = '(extract(epoch FROM clock_timestamp()) * 1000)::bigint';

/**
 * The PostgreSQL dialect: the record's statements for one table (`t`, quoted and schema-qualified),
 * run by the SQL store over any driver: `pg`'s (prepared, pipelined) or an ORM's.
 * The statements that wake waiters (`pg_notify`) answer one row per record they changed, and no
 * `void` column, which some drivers cannot decode.
 */
export function postgresStatements(t: string) {
  const NOW = `n AS (SELECT ${NOW_MS} AS ms)`;
  // The bounded claim (atomic mode over a driver) sets its own lock and statement timeouts ($7,
  // $8) before it inserts or locks, and sets them back to the session's defaults ($9, $10: read
  // once, since pg_settings costs a millisecond a read) once it has its row, so the handler's
  // statements never run under them: one round trip where the `pg` driver pipelines three
  // statements in a simple query, which no ORM can send.
  const BOUNDS = `bounds AS MATERIALIZED (SELECT set_config('lock_timeout', $7, true) AS l,
      set_config('statement_timeout', $8, true) AS s),
    n AS (SELECT ${NOW_MS} AS ms FROM bounds)`;
  const UNBOUND = `, set_config('lock_timeout', $9, true) AS l, set_config('statement_timeout', $10, true) AS s`;
  // One round trip for the common cases: a new key inserts; an existing one is read back in the
  // same statement. DO NOTHING, unlike DO UPDATE, neither locks nor writes the existing row, so
  // replays of a hot key run in parallel. The read uses the statement's snapshot and so misses a
  // row committed while the insert waited on it; the caller then asks again.
  const claim = (bounded: boolean) => `WITH ${bounded ? BOUNDS : NOW},
    ins AS (
      INSERT INTO ${t} (scope, key, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
      SELECT $1, $2, $3, $4, n.ms + $5, n.ms, n.ms + $6 FROM n
      ON CONFLICT (scope, key) DO NOTHING
      RETURNING token)
    SELECT true AS acquired, NULL AS fingerprint, false AS completed, NULL AS lease_left_ms,
      false AS claimable, NULL::integer AS status, NULL::json AS headers, NULL::bytea AS body${bounded ? UNBOUND : ''}
    FROM ins
    UNION ALL
    SELECT false, fingerprint, completed_at_ms IS NOT NULL, lease_until_ms - n.ms,
      expires_at_ms <= n.ms OR (completed_at_ms IS NULL AND lease_until_ms <= n.ms AND fingerprint = $3),
      status, headers, body${bounded ? UNBOUND : ''}
    FROM ${t}, n
    WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM ins)`;
  const CLAIM = claim(false);
  // A row is taken over when its retention has passed (a new operation), or when it is in progress
  // with a passed lease and the same fingerprint (a retry taking over a dead owner). The WHERE is
  // checked again under the row lock, so of concurrent takeovers exactly one wins. A dead owner's
  // operation keeps its created_at_ms and retention (so one that keeps failing still ends), never
  // expiring inside the new lease.
  const takeOver = (bounded: boolean) => `WITH ${bounded ? BOUNDS : NOW}
    UPDATE ${t} SET fingerprint = $3, token = $4, lease_until_ms = n.ms + $5,
      created_at_ms = CASE WHEN expires_at_ms <= n.ms THEN n.ms ELSE created_at_ms END,
      expires_at_ms = CASE WHEN expires_at_ms <= n.ms THEN n.ms + $6
        ELSE GREATEST(expires_at_ms, n.ms + $5) END,
      completed_at_ms = NULL, status = NULL, headers = NULL,
      body = NULL,
      steps = CASE WHEN expires_at_ms <= n.ms THEN NULL ELSE steps END,
      request = CASE WHEN expires_at_ms <= n.ms THEN NULL ELSE request END
    FROM n
    WHERE scope = $1 AND key = $2
      AND (expires_at_ms <= n.ms OR (completed_at_ms IS NULL AND lease_until_ms <= n.ms AND fingerprint = $3))
    RETURNING steps${bounded ? UNBOUND : ''}`;
  const TAKE_OVER = takeOver(false);
  const LEASE_LEFT = `SELECT lease_until_ms - n.ms AS lease_left_ms FROM ${t}, (SELECT ${NOW_MS} AS ms) n
    WHERE scope = $1 AND key = $2 AND completed_at_ms IS NULL AND lease_until_ms > n.ms
      AND expires_at_ms > n.ms`;
  // The NOTIFY rides in the same statement.
  const COMPLETE = `WITH n AS (SELECT ${NOW_MS} AS ms), done AS (
      UPDATE ${t} SET completed_at_ms = n.ms, status = $4, headers = $5, body = $6, request = NULL
      FROM n
      WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > n.ms
      RETURNING 1)
    SELECT 1 AS done FROM (SELECT pg_notify($7, $8) FROM done) notified`;
  // One write: the step is appended to the record's steps (a jsonb array keeps saving order).
  const SAVE_STEP = `UPDATE ${t}
    SET steps = coalesce(steps, '[]'::jsonb) || jsonb_build_array(jsonb_build_object('name', $4::text, 'value', $5::text)),
      request = coalesce($6, request)
    WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > ${NOW_MS}`;
  // The phase's lock: a takeover's UPDATE of this row waits until the phase commits or rolls back.
  const LOCK_OWNED = `SELECT token FROM ${t}
    WHERE scope = $1 AND key = $2 AND completed_at_ms IS NULL AND expires_at_ms > ${NOW_MS} FOR UPDATE`;
  const ABANDONED = `SELECT scope, key, fingerprint, request, lease_until_ms FROM ${t}, (SELECT ${NOW_MS} AS ms) n
    WHERE request IS NOT NULL AND completed_at_ms IS NULL AND lease_until_ms <= n.ms AND expires_at_ms > n.ms
    ORDER BY lease_until_ms LIMIT $1`;
  const RELEASE = `WITH gone AS (
      DELETE FROM ${t}
      WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL
        AND expires_at_ms > ${NOW_MS}
      RETURNING 1)
    SELECT 1 AS done FROM (SELECT pg_notify($4, $5) FROM gone) notified`;
  const DELETE = `WITH gone AS (
      DELETE FROM ${t} WHERE scope = $1 AND key = $2 AND expires_at_ms > ${NOW_MS}
      RETURNING 1)
    SELECT 1 AS done FROM (SELECT pg_notify($3, $4) FROM gone) notified`;
  // Retention grows with the lease when the lease would outlive it, as at the claim.
  const RENEW = `WITH n AS (SELECT ${NOW_MS} AS ms)
    UPDATE ${t} SET lease_until_ms = n.ms + $4, expires_at_ms = GREATEST(expires_at_ms, n.ms + $4)
    FROM n
    WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > n.ms`;
  // SKIP LOCKED: rows a claim is taking over right now are left for the next purge.
  const PURGE = `WITH n AS (SELECT ${NOW_MS} AS ms)
    DELETE FROM ${t} WHERE ctid = ANY(ARRAY(
      SELECT ctid FROM ${t}, n
      WHERE expires_at_ms <= n.ms AND NOT (completed_at_ms IS NULL AND lease_until_ms > n.ms)
      LIMIT $1 FOR UPDATE SKIP LOCKED))`;
  // COMPLETE, sent with the COMMIT in one round trip. It divides by the number of rows it
  // completed, so a claim lost meanwhile (the work outlived the record) raises division_by_zero:
  // the transaction is aborted, and the COMMIT after it never runs. No NOTIFY: no other
  // transaction ever sees this record in progress, so no one waits on it, and a NOTIFY takes a
  // database-wide lock at commit that serialises every notifying commit (measured: a third of
  // the keyed desk's backends waiting on it under load).
  // The record must also have been claimed by this very transaction (its xmin), so that a
  // transaction the handler committed itself fails here instead of completing in autocommit.
  const ATOMIC_COMPLETE = `WITH n AS (SELECT ${NOW_MS} AS ms), done AS (
      UPDATE ${t} SET completed_at_ms = n.ms, status = $4, headers = $5, body = $6 FROM n
      WHERE scope = $1 AND key = $2 AND token = $3 AND completed_at_ms IS NULL AND expires_at_ms > n.ms
        AND xmin::text = (txid_current() % 4294967296)::text
      RETURNING 1)
    SELECT 1 / count(*)::int AS done FROM done`;
  const get = (columns: string) =>
    `SELECT ${columns} FROM ${t} WHERE scope = $1 AND key = $2 AND expires_at_ms > ${NOW_MS}`;
  /** One page of `list`: `limit + 1` rows, so the caller knows whether another page follows. */
  function list(limit: number, page: { scope: string | undefined; after: string[] | undefined }) {
    const values: (string | number)[] = [limit + 1];
    const where = ['expires_at_ms > n.ms'];
    if (page.scope !== undefined) where.push(`scope = $${values.push(page.scope)}`);
    // A row comparison: a range scan of the primary key, so a deep page costs no more than the first.
    if (page.after)
      where.push(`(scope, key) > ($${values.push(page.after[0]!)}, $${values.push(page.after[1]!)})`);
    const text = `SELECT ${SUMMARY_COLUMNS} FROM ${t}, (SELECT ${NOW_MS} AS ms) n
      WHERE ${where.join(' AND ')} ORDER BY scope, key LIMIT $1`;
    return { text, values };
  }
  // Whether the transaction that claimed has ended under us: it got an id with its claim, so a
  // statement that finds none runs outside it (autocommit, after the handler's own COMMIT).
  const ENDED = 'SELECT txid_current_if_assigned() IS NULL AS ended';
  // The session's own lock and statement timeouts, which a bounded claim sets back.
  const SESSION_TIMEOUTS = `SELECT name, reset_val FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout')`;
  return {
    ENDED,
    SESSION_TIMEOUTS,
    GET: get(SUMMARY_COLUMNS),
    GET_WITH_RESPONSE: get(`${SUMMARY_COLUMNS}, ${RESPONSE_COLUMNS}`),
    list,
    CLAIM,
    TAKE_OVER,
    LEASE_LEFT,
    COMPLETE,
    SAVE_STEP,
    LOCK_OWNED,
    ABANDONED,
    RELEASE,
    DELETE,
    RENEW,
    PURGE,
    ATOMIC_COMPLETE,
    BOUNDED_CLAIM: claim(true),
    BOUNDED_TAKE_OVER: takeOver(true),
  };
}

/**
 * A claim that finds the record changing under it (committed while the insert waited on it,
 * released, taken over by another retry) asks again; a few rounds settle any realistic interleaving.
 */
const CLAIM_ATTEMPTS = 4;

/** A row of CLAIM, as `pg` decodes it or as another driver may (bigint as text, json as text). */
export interface RecordRow {
  acquired: boolean;
  fingerprint: string;
  completed: boolean;
  lease_left_ms: string | number | null;
  claimable: boolean;
  status: number | null;
  headers: Record<string, string> | string | null;
  body: Uint8Array | null;
}

export type ClaimValues = [string, string, string, string, number, number];
/** Runs CLAIM (`take: false`) or TAKE_OVER with `values`, on whichever connection the caller holds. */
export type ClaimQuery = (take: boolean, values: ClaimValues) => Promise<{ rows: unknown[] }>;

/** The claim loop over CLAIM and TAKE_OVER: one round trip for a new key or a replay. */
export async function claimRecord(query: ClaimQuery, input: ClaimInput): Promise<ClaimResult> {
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
    const row = (await query(false, values)).rows[0] as RecordRow | undefined;
    if (row?.acquired) return { outcome: 'acquired', token };
    if (row && !row.claimable) {
      if (row.fingerprint !== input.fingerprint) return { outcome: 'mismatch' };
      if (row.completed) {
        const headers = typeof row.headers === 'string' ? JSON.parse(row.headers) : row.headers;
        const body =
          row.body === null
            ? Buffer.alloc(0)
            : Buffer.from(row.body.buffer, row.body.byteOffset, row.body.byteLength);
        return { outcome: 'replay', response: { status: Number(row.status), headers: headers ?? {}, body } };
      }
      return { outcome: 'in_progress', retryAfterMs: Math.max(0, Number(row.lease_left_ms)) };
    }
    const taken = row && (await query(true, values)).rows;
    if (taken && taken.length === 1) {
      const steps = (taken[0] as { steps: string | SavedStep[] | null }).steps;
      return steps ? { outcome: 'acquired', token, steps: stepsOf(steps) } : { outcome: 'acquired', token };
    }
    if (attempt === CLAIM_ATTEMPTS) return { outcome: 'in_progress', retryAfterMs: 0 };
  }
}
