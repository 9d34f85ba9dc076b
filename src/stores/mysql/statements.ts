import type { ClaimInput, ClaimResult } from '../../core/store.js';
import { RESPONSE_COLUMNS, stepsOf, toBuffer } from '../internal.js';

// UTC_TIMESTAMP, unlike NOW(), ignores the session's time zone (and its DST gaps); it is fixed
// for the duration of a statement, so every use in one statement agrees.
export const NOW_MS = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)";

/** The store's SQL texts, built once per table (`t`, the quoted table name). */
export function statements(t: string) {
  // The update takes the record over when its retention has passed (a new operation) or when it
  // is in progress with a passed lease and the same fingerprint (a retry taking over a dead
  // owner). InnoDB evaluates it on the latest committed row under that row's exclusive lock, so
  // of concurrent claims exactly one writes its token. MySQL assigns left to right, seeing the
  // columns already assigned, and MariaDB's SIMULTANEOUS_ASSIGNMENT sees the old ones: the test
  // `token = :token OR <condition>` is true after the takeover's first assignment under both.
  // Steps, request and created_at_ms come before expires_at_ms, which they test, is assigned: a
  // takeover of a passed lease keeps them and the first claim's retention (the retry resumes the
  // operation, which still ends; never inside the new lease), one of a passed retention (a new
  // operation) drops them and starts anew.
  const TAKE = `(token = :token OR expires_at_ms <= ${NOW_MS}
    OR (completed_at_ms IS NULL AND lease_until_ms <= ${NOW_MS} AND fingerprint = :fingerprint))`;
  const CLAIM = `INSERT INTO ${t} (scope, \`key\`, fingerprint, token, lease_until_ms, created_at_ms, expires_at_ms)
    VALUES (:scope, :key, :fingerprint, :token, ${NOW_MS} + :leaseMs, ${NOW_MS} + LAST_INSERT_ID(0),
      ${NOW_MS} + :retainMs)
    ON DUPLICATE KEY UPDATE
      steps = IF(${TAKE}, IF(expires_at_ms <= ${NOW_MS}, NULL, steps), steps),
      request = IF(${TAKE}, IF(expires_at_ms <= ${NOW_MS}, NULL, request), request),
      token = IF(${TAKE}, :token, token),
      fingerprint = IF(${TAKE}, :fingerprint, fingerprint),
      lease_until_ms = IF(${TAKE}, ${NOW_MS} + :leaseMs, lease_until_ms),
      created_at_ms = IF(${TAKE}, IF(expires_at_ms <= ${NOW_MS}, ${NOW_MS}, created_at_ms), created_at_ms)
        + LAST_INSERT_ID(1) - 1,
      expires_at_ms = IF(${TAKE}, IF(expires_at_ms <= ${NOW_MS}, ${NOW_MS} + :retainMs,
        GREATEST(expires_at_ms, ${NOW_MS} + :leaseMs)), expires_at_ms),
      status = IF(${TAKE}, NULL, status),
      headers = IF(${TAKE}, NULL, headers),
      body = IF(${TAKE}, NULL, body),
      completed_at_ms = IF(${TAKE}, NULL, completed_at_ms)`;
  // The claim's insertId says which way it went (MySQL's LAST_INSERT_ID(expr) idiom, the table
  // has no AUTO_INCREMENT): 0 when it inserted a new row, ours, so nothing need be read back; 1
  // when it met a row, which RECORD then reads.
  // What the claim met, read after it. The claim decided; this only reports: `token` says
  // whether ours was written (an insert answers 1 row, as does an untouched row under mysql2's
  // default FOUND_ROWS flag, so the count alone cannot tell).
  const RECORD = `SELECT token, fingerprint, completed_at_ms IS NOT NULL AS completed,
      lease_until_ms - ${NOW_MS} AS lease_left_ms,
      (expires_at_ms <= ${NOW_MS} OR (completed_at_ms IS NULL AND lease_until_ms <= ${NOW_MS}
        AND fingerprint = :fingerprint)) AS claimable,
      status, headers, body, steps
    FROM ${t} WHERE scope = :scope AND \`key\` = :key`;
  const LIVE = `scope = :scope AND \`key\` = :key AND expires_at_ms > ${NOW_MS}`;
  const OWNED = `${LIVE} AND token = :token AND completed_at_ms IS NULL`;
  const COMPLETE = `UPDATE ${t} SET completed_at_ms = ${NOW_MS}, status = :status, headers = :headers, body = :body,
      request = NULL
    WHERE ${OWNED}`;
  // Atomic mode on MariaDB: a COMPLETE that a handler's own COMMIT made run in autocommit (where
  // @@in_transaction is 0) changes nothing, so the store notices. MySQL has no such variable.
  const ATOMIC_COMPLETE = `${COMPLETE} AND @@in_transaction = 1`;
  // One write, fenced like COMPLETE: the step (JSON text made here) is appended to the record's
  // steps, a JSON array kept as text in saving order, byte for byte as written.
  const SAVE_STEP = `UPDATE ${t}
    SET steps = IF(steps IS NULL, CONCAT('[', :step, ']'),
        CONCAT(LEFT(steps, CHAR_LENGTH(steps) - 1), ',', :step, ']')),
      request = COALESCE(:request, request)
    WHERE ${OWNED}`;
  // The phase's lock: a takeover's claim of this row waits until the phase commits or rolls back.
  const LOCK_OWNED = `SELECT token FROM ${t} WHERE ${LIVE} AND completed_at_ms IS NULL FOR UPDATE`;
  // The (completed_at_ms, lease_until_ms) index: the NULL completions, oldest lease first.
  const ABANDONED = `SELECT scope, \`key\`, fingerprint, request, lease_until_ms FROM ${t}
    WHERE completed_at_ms IS NULL AND lease_until_ms <= ${NOW_MS} AND expires_at_ms > ${NOW_MS}
      AND request IS NOT NULL
    ORDER BY lease_until_ms LIMIT :limit`;
  const RELEASE = `DELETE FROM ${t} WHERE ${OWNED}`;
  const RENEW = `UPDATE ${t} SET lease_until_ms = ${NOW_MS} + :leaseMs,
      expires_at_ms = GREATEST(expires_at_ms, ${NOW_MS} + :leaseMs)
    WHERE ${OWNED}`;
  const LEASE_LEFT = `SELECT lease_until_ms - ${NOW_MS} AS lease_left_ms FROM ${t}
    WHERE ${LIVE} AND completed_at_ms IS NULL AND lease_until_ms > ${NOW_MS}`;
  const DELETE = `DELETE FROM ${t} WHERE ${LIVE}`;
  // Single-table DELETE … LIMIT walks the expires_at_ms index; a row an atomic claim is taking
  // over waits for that claim, then is checked again and kept, its retention renewed.
  const PURGE = `DELETE FROM ${t}
    WHERE expires_at_ms <= ${NOW_MS} AND NOT (completed_at_ms IS NULL AND lease_until_ms > ${NOW_MS})
    ORDER BY expires_at_ms LIMIT :batchSize`;
  const SUMMARY = `scope, \`key\`, status, created_at_ms, expires_at_ms, lease_until_ms, completed_at_ms, steps`;
  const get = (columns: string) => `SELECT ${columns} FROM ${t} WHERE ${LIVE}`;
  /** One page of `list`: `limit + 1` rows, so the caller knows whether another page follows. */
  function list(limit: number, page: { scope: string | undefined; after: string[] | undefined }) {
    const values: Record<string, string | number> = { limit: limit + 1 };
    const where = [`expires_at_ms > ${NOW_MS}`];
    if (page.scope !== undefined) {
      where.push('scope = :scope');
      values.scope = page.scope;
    }
    // Spelled out rather than a row comparison, which not every version turns into a range scan.
    if (page.after) {
      where.push('(scope > :afterScope OR (scope = :afterScope AND `key` > :afterKey))');
      values.afterScope = page.after[0]!;
      values.afterKey = page.after[1]!;
    }
    const text = `SELECT ${SUMMARY} FROM ${t} WHERE ${where.join(' AND ')} ORDER BY scope, \`key\` LIMIT :limit`;
    return { text, values };
  }
  return {
    CLAIM,
    RECORD,
    LIVE,
    COMPLETE,
    ATOMIC_COMPLETE,
    SAVE_STEP,
    LOCK_OWNED,
    ABANDONED,
    RELEASE,
    RENEW,
    LEASE_LEFT,
    DELETE,
    PURGE,
    SUMMARY,
    GET: get(SUMMARY),
    GET_WITH_RESPONSE: get(`${SUMMARY}, ${RESPONSE_COLUMNS}`),
    list,
    // Whether the transaction that claimed has ended under us (a handler's own COMMIT): MariaDB
    // only; MySQL has no such variable.
    ENDED: 'SELECT @@in_transaction AS open',
    // A duplicate blocks on the record's row lock until the first's transaction ends; InnoDB
    // bounds that wait in whole seconds only.
    BOUND_LOCK_WAIT: 'SET SESSION innodb_lock_wait_timeout = :seconds',
    UNBOUND_LOCK_WAIT: 'SET SESSION innodb_lock_wait_timeout = DEFAULT',
  };
}

/** A row of RECORD, as mysql2 decodes it or as another driver may (numbers as text, bytes as a Uint8Array). */
export interface RecordRow {
  token: string;
  fingerprint: string;
  completed: number | string;
  lease_left_ms: number | string;
  claimable: number | string;
  status: number | null;
  headers: string | null;
  body: Uint8Array | null;
  steps: string | null;
}

/** The named values of CLAIM and RECORD for `input`, claiming with `token`. */
export function claimValues(input: ClaimInput, token: string) {
  const { scope, key, fingerprint, leaseMs, retainMs } = input;
  return { scope, key, fingerprint, token, leaseMs, retainMs };
}

/**
 * What a claim got, from the RECORD row read after it: `token` is the one the claim wrote if it
 * took the record; `undefined` when the row changed between the two statements (ask again).
 */
export function claimOfRecord(
  row: RecordRow | undefined,
  token: string,
  input: ClaimInput,
): ClaimResult | undefined {
  if (!row) return undefined;
  if (row.token === token) {
    return row.steps === null
      ? { outcome: 'acquired', token }
      : { outcome: 'acquired', token, steps: stepsOf(row.steps) };
  }
  if (Number(row.claimable)) return undefined;
  if (row.fingerprint !== input.fingerprint) return { outcome: 'mismatch' };
  if (Number(row.completed)) {
    const body = row.body ? toBuffer(row.body) : Buffer.alloc(0);
    const headers = row.headers ? (JSON.parse(row.headers) as Record<string, string>) : {};
    return { outcome: 'replay', response: { status: Number(row.status), headers, body } };
  }
  return { outcome: 'in_progress', retryAfterMs: Math.max(0, Number(row.lease_left_ms)) };
}
