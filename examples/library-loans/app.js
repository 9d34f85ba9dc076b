import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { credentialScope, startCompleter, storeCircuit } from 'retrysafe';
import { idempotency } from 'retrysafe/node';
import { adminRoutes } from './admin.js';
import { openDatabase, openKeyStore } from './databases/index.js';
import { fineRoutes } from './fines.js';
import { identifierProblem, isJsonBody, readJsonObject, unsupportedMediaType } from './http/json-body.js';
import { databaseUnavailable, sendJson as send, sendFound } from './http/respond.js';
import { webRoutes } from './http/web.js';
import { operations } from './operations.js';
import { answerReceipt, startReceipts } from './receipts.js';

const DATE = /^(\d{4})-(\d{2})-(\d{2})$/;
const DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
const LOAN_SHAPE = '{"member", "isbn", "issuedAt"}';

/**
 * Whether `text` is a real date of the (proleptic Gregorian) calendar, like "2026-03-10". Date.parse
 * would take 2026-02-31 as March 3rd; counting the month's days also costs a fraction of parsing.
 */
function isCalendarDate(text) {
  const parts = DATE.exec(text);
  if (!parts) return false;
  const [year, month, day] = [Number(parts[1]), Number(parts[2]), Number(parts[3])];
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  const days = month === 2 && leap ? 29 : DAYS_IN_MONTH[month - 1];
  return days !== undefined && day >= 1 && day <= days;
}

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
  const { value, problem } = readJsonObject(body, LOAN_SHAPE);
  if (problem) return { problem };
  const badId = identifierProblem(value, 'member') ?? identifierProblem(value, 'isbn');
  if (badId) return { problem: badId };
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
 * The loan desk's HTTP handler over a loan database (databases/) and an idempotency
 * store. `POST /loans` is guarded: a retry with the same `Idempotency-Key` replays the first answer
 * instead of lending the book again; without a key every call is a new loan. The pages and the
 * admin API (http/web.js, admin.js) read `adminToken` and `demoFaults` from the other `settings`;
 * `ops` (operations.js) hears the idempotency events and serves `/metrics`. `POST /fines` is
 * fines.js. Answers the request handler and `resumeFine`, which re-drives an abandoned fine
 * (the completer's work). `onLent` (optional) hears that a loan was answered, so its receipt job
 * (receipts.js) is committed and can be sent now; `GET /loans/:id/receipt` reads it.
 * `crashAfterStep` (`DEMO_FAULTS=1` only, faults/test-hooks.js) wraps the fine's handler.
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
  onLent,
  crashAfterStep,
  ...settings
}) {
  const guarding = {
    onEvent: ops?.onEvent,
    store,
    ttl: ttlMs,
    lease: leaseMs,
    wait: waitMs,
    scope: scopeBy(scopeSecret),
    encryptionKey: encryptionKeys,
  };
  const guard = idempotency({ ...guarding, mode, required });
  // A fine calls the payment provider between its database writes, which no transaction can span:
  // lease mode, its steps saved one by one (phases when the keys share the desk's database).
  // `route`: the completer re-drives only operations this handler started.
  const fineGuard = idempotency({ ...guarding, mode: 'lease', required: true, route: 'POST /fines' });
  const fines = fineRoutes({
    database,
    guard: crashAfterStep ? (handler) => fineGuard(crashAfterStep(handler)) : fineGuard,
    phases: store === database.store,
    ...settings,
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
    // Once answered, the loan (and its receipt job) committed: atomic mode commits before the answer.
    if (onLent) res.once('finish', onLent);
    send(res, 201, { id, member, isbn, issuedAt }, { location: `/loans/${id}` });
  });

  const web = webRoutes(settings);
  const admin = adminRoutes({ store, encryptionKeys, ...settings });

  const read = (res, query) => sendFound(res, query, 'loan_not_found');

  /**
   * `GET /health`: 200 while keyed writes can be taken; 503 with `Retry-After` while the key
   * store's circuit breaker is open (its calls kept failing, so retrysafe refuses them at once).
   */
  function health(res) {
    const { state, failures } = storeCircuit(store);
    const keyStore = { name: store.name, circuit: state, failedCalls: failures };
    if (state === 'open') return send(res, 503, { status: 'unavailable', keyStore }, { 'retry-after': '1' });
    send(res, 200, { status: state === 'closed' ? 'ok' : 'recovering', keyStore });
  }

  function loanDeskHandler(req, res) {
    const reading = req.method === 'GET' || req.method === 'HEAD';
    // The hot path, POST /loans, needs no URL parsed; any other target is normalised by URL.
    if (req.url === '/loans' && req.method === 'POST') {
      return isJsonBody(req) ? createLoan(req, res) : unsupportedMediaType(res, 'the loan');
    }
    const url = new URL(req.url ?? '/', 'http://loan-desk');
    const { pathname } = url;
    const allow = (methods) =>
      send(res, 405, { error: 'method_not_allowed', allow: methods }, { allow: methods });

    if (pathname === '/loans') {
      if (req.method === 'POST')
        return isJsonBody(req) ? createLoan(req, res) : unsupportedMediaType(res, 'the loan');
      return reading ? read(res, () => database.listLoans()) : allow('GET, HEAD, POST');
    }
    const loanPath = /^\/loans\/([^/]+)(\/receipt)?$/.exec(pathname);
    if (loanPath) {
      if (!reading) return allow('GET, HEAD');
      const id = /^[1-9]\d{0,8}$/.test(loanPath[1]) ? Number(loanPath[1]) : undefined;
      if (loanPath[2]) return answerReceipt(res, database, id);
      return read(res, () => (id === undefined ? undefined : database.getLoan(id)));
    }
    if (pathname === '/books') return reading ? read(res, () => database.listBooks()) : allow('GET, HEAD');
    if (pathname === '/members')
      return reading ? read(res, () => database.listMembers()) : allow('GET, HEAD');
    if (pathname === '/health') return reading ? health(res) : allow('GET, HEAD');
    if (fines.handler(req, res, url) || web(req, res, url) || admin(req, res, url)) return;
    if (ops?.route(req, res, pathname)) return;
    send(res, 404, { error: 'path_not_found' });
  }

  return { handler: loanDeskHandler, resumeFine: fines.createFine.resume };
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
  // Test and demo hooks load only when a setting asks for one (faults/test-hooks.js).
  const { delayMs: receiptDelayMs } = config.receipts;
  const hooks = config.demoFaults || receiptDelayMs ? await import('./faults/test-hooks.js') : undefined;
  // Every desk process sends receipts (the outbox's leases, or BullMQ's locks, share the jobs out)
  // unless RECEIPTS=0 leaves them to the processes that do.
  const receipts = config.receipts.send
    ? await startReceipts({
        ...config,
        database: receiptDelayMs ? hooks.slowReceipts(database, receiptDelayMs) : database,
        store,
        logger: ops.logger,
      })
    : undefined;
  const desk = loanDesk({
    ...config,
    database,
    store,
    ops,
    scopeSecret,
    onLent: receipts?.nudge,
    crashAfterStep: config.demoFaults ? hooks.crashAfterStep : undefined,
  });
  const server = http.createServer(desk.handler);
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(config.port, config.host, resolve);
  });
  const purge = setInterval(() => {
    store.purgeExpired().then(ops.purged, (error) => ops.logger.error({ err: error }, 'purge failed'));
  }, config.purgeIntervalMs);
  purge.unref();
  // Fines whose client never came back (the desk died mid-way) are finished here, by whichever
  // desk process claims them first.
  const completer = config.completer
    ? startCompleter({
        store,
        resume: desk.resumeFine,
        interval: config.completerIntervalMs,
        onError: (error) => ops.logger.error({ err: error }, 'completer pass failed'),
      })
    : undefined;
  const { port } = server.address();
  return {
    url: deskUrl(config.host, port),
    port,
    server,
    database,
    store,
    async close() {
      clearInterval(purge);
      await completer?.stop();
      await receipts?.stop();
      const closed = new Promise((resolve) => server.close(resolve));
      server.closeIdleConnections();
      await closed;
      if (store !== database.store) await store.close();
      await database.close();
      ops.close();
    },
  };
}
