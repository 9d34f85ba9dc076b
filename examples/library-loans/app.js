import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { MIMEType } from 'node:util';
import { credentialScope } from 'retrysafe';
import { idempotency } from 'retrysafe/node';
import { adminRoutes } from './admin.js';
import { openDatabase, openKeyStore } from './database.js';
import { operations } from './operations.js';
import { sendJson as send } from './respond.js';
import { losingMarkedAnswers, webRoutes } from './web.js';

const DATE = /^\d{4}-\d{2}-\d{2}$/;
const IDENTIFIER = /^[^\p{Cc}]{1,64}$/u;

// Date.parse accepts 2026-02-31 (as March 3rd); a real calendar date survives the round trip.
const isCalendarDate = (text) =>
  DATE.test(text) && !Number.isNaN(Date.parse(text)) && new Date(text).toISOString().startsWith(text);

function databaseUnavailable(res, doing, error) {
  console.error(`loan desk: ${doing} failed:`, error.message);
  send(
    res,
    503,
    { error: 'database_unavailable', message: 'The database did not answer; try again.' },
    { 'retry-after': '1' },
  );
}

/**
 * Whether a body is declared JSON (`application/json`, UTF-8 if a charset is named). A form or a
 * `text/plain` post from a page on another site needs no CORS preflight; refusing them (415) before
 * anything is claimed or written means such a page cannot lend a book.
 */
function isJsonBody(req) {
  const declared = req.headers['content-type'];
  // The types clients send, recognised without parsing: a MIMEType costs more than a replay.
  if (declared === 'application/json' || declared === 'application/json; charset=utf-8') return true;
  try {
    const type = new MIMEType(declared ?? '');
    const charset = type.params.get('charset');
    return type.essence === 'application/json' && (charset === null || charset.toLowerCase() === 'utf-8');
  } catch {
    return false;
  }
}

const unsupportedMediaType = (res) =>
  send(
    res,
    415,
    {
      error: 'unsupported_media_type',
      message: 'Send the loan as JSON, with Content-Type: application/json.',
    },
    { 'accept-post': 'application/json' },
  );

/**
 * The caller's credential names its key scope: two callers sending the same key string name two
 * operations, whatever their `Authorization` scheme (a malformed one too). Only an HMAC of the
 * whole value, keyed by the desk's scope secret, reaches the key store (and /admin/keys), so a weak
 * password cannot be guessed back from it; callers without one share `anonymous`.
 */
const scopeBy = (scopeSecret) => (req) =>
  credentialScope(req.headers.authorization, scopeSecret) || 'anonymous';

/** Checks the body of `POST /loans`; a `problem` is answered with 400 before anything is written. */
export function parseLoan(body) {
  if (body.length === 0) {
    return {
      problem: { error: 'invalid_body', message: 'The body is empty; send {"member", "isbn", "issuedAt"}.' },
    };
  }
  let value;
  try {
    value = JSON.parse(body.toString('utf8'));
  } catch (error) {
    return { problem: { error: 'invalid_json', message: `The body is not valid JSON: ${error.message}` } };
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return {
      problem: {
        error: 'invalid_body',
        message: 'The body must be a JSON object {"member", "isbn", "issuedAt"}.',
      },
    };
  }
  for (const field of ['member', 'isbn']) {
    const text = value[field];
    // PostgreSQL refuses NUL in text; no id has a control character, so none reaches a database.
    if (typeof text !== 'string' || !IDENTIFIER.test(text)) {
      return {
        problem: {
          error: 'validation',
          field,
          message: `${field} must be a string of 1 to 64 characters, none a control character.`,
        },
      };
    }
  }
  const { issuedAt } = value;
  if (typeof issuedAt !== 'string' || !isCalendarDate(issuedAt)) {
    return {
      problem: {
        error: 'validation',
        field: 'issuedAt',
        message: 'issuedAt must be a date like "2026-03-10".',
      },
    };
  }
  return { loan: { member: value.member, isbn: value.isbn, issuedAt } };
}

/**
 * The loan desk's HTTP handler over a loan database (sqlite.js or postgres.js) and an idempotency
 * store. `POST /loans` is guarded: a retry with the same `Idempotency-Key` replays the first answer
 * instead of lending the book again; without a key every call is a new loan. The pages and the
 * admin API (web.js, admin.js) read `adminToken` and `demoFaults` from the other `settings`;
 * `ops` (operations.js) hears the idempotency events and serves `/metrics`.
 */
export function loanDesk({
  database,
  store,
  mode,
  ttlMs,
  leaseMs,
  waitMs,
  required,
  encryptionKeys,
  scopeSecret,
  ops,
  ...settings
}) {
  const guard = idempotency({
    onEvent: ops?.onEvent,
    store,
    mode,
    ttl: ttlMs,
    lease: leaseMs,
    wait: waitMs,
    required,
    scope: scopeBy(scopeSecret),
    encryptionKey: encryptionKeys,
  });

  // In atomic mode `idem.tx` is the transaction holding the claim: the loan commits with the
  // saved response or not at all. In lease mode nothing fences the loan's INSERT itself: a dead
  // desk's statement queued in the database can commit after its lease, when a retry already ran
  // the handler again, so the loan is keyed by its intent and a second INSERT returns the first.
  const createLoan = guard(async function createLoan(req, res, idem) {
    const { loan, problem } = parseLoan(req.body);
    if (problem) return send(res, 400, problem);
    let result;
    try {
      result = await database.createLoan(loan, {
        tx: idem?.tx,
        // The same key with another body is another intent once the key's record is gone
        // (deleted, purged, lost with a Redis restart): the fingerprint is part of it.
        intent: idem?.downstreamKey(`loan ${idem.fingerprint}`),
        intentTtlMs: ttlMs,
      });
    } catch (error) {
      // A 5xx is not kept: the key is released (lease mode) or the transaction rolled back (atomic
      // mode), so the client's retry with the same key lends the book once the database is back.
      return databaseUnavailable(res, 'lending', error);
    }
    if (result.missing) {
      return send(res, 422, {
        error: 'validation',
        field: result.missing,
        message: `No ${result.missing === 'isbn' ? 'book with isbn' : 'member with id'} ${loan[result.missing]}.`,
      });
    }
    const { id, member, isbn, issuedAt } = result.loan;
    send(res, 201, { id, member, isbn, issuedAt }, { location: `/loans/${id}` });
  });

  const issueLoan = losingMarkedAnswers(createLoan, settings);
  const web = webRoutes(settings);
  const admin = adminRoutes({ store, ...settings });

  async function read(res, query) {
    try {
      const found = await query();
      if (found === undefined) return send(res, 404, { error: 'loan_not_found' });
      send(res, 200, found);
    } catch (error) {
      databaseUnavailable(res, 'reading', error);
    }
  }

  return function loanDeskHandler(req, res) {
    const reading = req.method === 'GET' || req.method === 'HEAD';
    // The hot path, POST /loans, needs no URL parsed; any other target is normalised by URL.
    if (req.url === '/loans' && req.method === 'POST') {
      return isJsonBody(req) ? issueLoan(req, res) : unsupportedMediaType(res);
    }
    const url = new URL(req.url ?? '/', 'http://loan-desk');
    const { pathname } = url;
    const allow = (methods) =>
      send(res, 405, { error: 'method_not_allowed', allow: methods }, { allow: methods });

    if (pathname === '/loans') {
      if (req.method === 'POST') return isJsonBody(req) ? issueLoan(req, res) : unsupportedMediaType(res);
      return reading ? read(res, () => database.listLoans()) : allow('GET, HEAD, POST');
    }
    const loanPath = /^\/loans\/([^/]+)$/.exec(pathname);
    if (loanPath) {
      if (!reading) return allow('GET, HEAD');
      const id = /^[1-9]\d{0,8}$/.test(loanPath[1]) ? Number(loanPath[1]) : undefined;
      return read(res, () => (id === undefined ? undefined : database.getLoan(id)));
    }
    if (pathname === '/books') return reading ? read(res, () => database.listBooks()) : allow('GET, HEAD');
    if (pathname === '/members')
      return reading ? read(res, () => database.listMembers()) : allow('GET, HEAD');
    if (web(req, res, url) || admin(req, res, url) || ops?.route(req, res, pathname)) return;
    send(res, 404, { error: 'path_not_found' });
  };
}

export const deskUrl = (host, port) => `http://${host.includes(':') ? `[${host}]` : host}:${port}`;

/**
 * Opens the database and the key store named by `config` (config.js), serves the desk on
 * `config.host`/`config.port` and purges expired keys every `config.purgeIntervalMs`.
 * `setup: true` creates the schema and catalog first. `close()` stops accepting connections, lets
 * the requests in flight finish, then closes the stores.
 */
export async function startLoanDesk(config, { setup }) {
  const database = await openDatabase(config, { setup });
  const store = await openKeyStore(config, database);
  const ops = operations(config);
  // SCOPE_SECRET, or the one the first desk on this database made: every process must agree, or a
  // retry landing on another one would not find its key.
  const scopeSecret =
    config.scopeSecret ?? (await database.secret('scope', randomBytes(32).toString('base64url')));
  const server = http.createServer(loanDesk({ ...config, database, store, ops, scopeSecret }));
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(config.port, config.host, resolve);
  });
  const purge = setInterval(() => {
    store.purgeExpired().then(ops.purged, (error) => ops.logger.error({ err: error }, 'purge failed'));
  }, config.purgeIntervalMs);
  purge.unref();
  const { port } = server.address();
  return {
    url: deskUrl(config.host, port),
    port,
    server,
    database,
    store,
    async close() {
      clearInterval(purge);
      const closed = new Promise((resolve) => server.close(resolve));
      server.closeIdleConnections();
      await closed;
      if (store !== database.store) await store.close();
      await database.close();
      ops.close();
    },
  };
}
