import { isStepFenced } from 'retrysafe';
import { identifierProblem, isJsonBody, readJsonObject, unsupportedMediaType } from './http/json-body.js';
import { databaseUnavailable, sendJson as send, sendFound } from './http/respond.js';

const FINE_SHAPE = '{"member", "amount"}';
/** The provider's limit (examples/payment-provider): a larger fine could never be charged. */
const MAX_FINE_CENTS = 99_999_999;
const FINE_CURRENCY = 'eur';
/**
 * How long a charge may take before the desk answers 503 and leaves the rest to a retry or the
 * completer: the provider answers in milliseconds, and a client waits on this request.
 */
const PROVIDER_TIMEOUT_MS = 5000;

/** Checks the body of `POST /fines`; a `problem` is answered with 400 before anything is written. */
export function parseFine(body) {
  const { value, problem } = readJsonObject(body, FINE_SHAPE);
  if (problem) return { problem };
  const badMember = identifierProblem(value, 'member');
  if (badMember) return { problem: badMember };
  const { amount } = value;
  if (!Number.isInteger(amount) || amount < 1 || amount > MAX_FINE_CENTS) {
    return {
      problem: {
        error: 'validation',
        field: 'amount',
        message: `amount must be an integer number of cents from 1 to ${MAX_FINE_CENTS}.`,
      },
    };
  }
  return { fine: { member: value.member, amount } };
}

class ProviderUnavailable extends Error {}

/** Charges at the provider with `key` as its `Idempotency-Key`: a retried charge is the same charge. */
async function chargeAt(providerUrl, charge, key) {
  try {
    const response = await fetch(new URL('/charges', providerUrl), {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify(charge),
      signal: AbortSignal.timeout(PROVIDER_TIMEOUT_MS),
    });
    const text = await response.text();
    // Whatever else it answers (5xx, a 409 while our own earlier attempt is in flight), nothing
    // was charged for this key yet, or the next attempt with it replays the charge.
    if (response.status !== 201) throw new Error(`it answered ${response.status}: ${text.slice(0, 200)}`);
    return JSON.parse(text);
  } catch (error) {
    throw new ProviderUnavailable(`the payment provider did not charge: ${error.message}`);
  }
}

/**
 * `POST /fines`, `GET /fines?member=` and `GET /fines/:id`. A fine is paid in three steps of one
 * guarded operation (`guard` in lease mode, a key required): `recorded` (the fine, pending),
 * `charged` (at the payment provider, with a key derived from ours so a second attempt replays
 * the charge), `paid`. Each step's result is saved on the key's record before the next starts:
 * a retry, or the completer, after the desk died resumes at the first unfinished step. With keys
 * in the desk's database (`phases`), `recorded` and `paid` commit with their saved result in one
 * transaction (`charged` stays a step: no transaction is held across the provider call); with keys elsewhere the fine's `intent` makes a second `recorded` return the first.
 * Its handler takes the request's parsed URL and answers `false` for paths it does not serve;
 * `createFine` is the guarded handler the completer re-drives.
 */
export function fineRoutes({ database, guard, phases, providerUrl }) {
  const createFine = guard(async function createFine(req, res, idem) {
    const { fine, problem } = parseFine(req.body);
    if (problem) return send(res, 400, problem);
    /**
     * Runs step `name` once per fine. `database: true` marks work in the desk's own database, a
     * phase on `tx` when the keys share it. A call to another service is never a phase: a phase
     * holds a database transaction (SQLite's write lock, a pooled PostgreSQL connection) for as
     * long as its work runs, and a charge that hangs would hold it for every other request.
     */
    const step = (name, work, { database: inDatabase = false } = {}) =>
      phases && inDatabase ? idem.phase(name, work) : idem.step(name, () => work(undefined));
    try {
      if (!(await database.memberExists(fine.member))) {
        return send(res, 422, {
          error: 'validation',
          field: 'member',
          message: `No member with id ${fine.member}.`,
        });
      }
      const intent = idem.downstreamKey(`fine ${idem.fingerprint}`);
      const recorded = await step('recorded', (tx) => database.recordFine(fine, { tx, intent }), {
        database: true,
      });
      const charge = await step('charged', () =>
        chargeAt(
          providerUrl,
          { amount: recorded.amount, currency: FINE_CURRENCY, reference: String(recorded.id) },
          idem.stepKey('charged'),
        ),
      );
      const paid = await step('paid', (tx) => database.markFinePaid(recorded.id, charge.id, { tx }), {
        database: true,
      });
      send(res, 201, paid, { location: `/fines/${paid.id}` });
    } catch (error) {
      // Another request took the key over: the engine answers for this one.
      if (isStepFenced(error)) throw error;
      if (error instanceof ProviderUnavailable) {
        console.error(`loan desk: fine of ${fine.member}: ${error.message}`);
        return send(
          res,
          503,
          { error: 'provider_unavailable', message: 'The payment provider did not answer; try again.' },
          { 'retry-after': '1' },
        );
      }
      return databaseUnavailable(res, 'fining', error);
    }
  });

  const read = (res, query) => sendFound(res, query, 'fine_not_found');

  function fineHandler(req, res, { pathname, searchParams }) {
    const reading = req.method === 'GET' || req.method === 'HEAD';
    const allow = (methods) =>
      send(res, 405, { error: 'method_not_allowed', allow: methods }, { allow: methods });
    if (pathname === '/fines') {
      if (req.method === 'POST') {
        if (isJsonBody(req)) createFine(req, res);
        else unsupportedMediaType(res, 'the fine');
      } else if (reading) read(res, () => database.listFines(searchParams.get('member') ?? undefined));
      else allow('GET, HEAD, POST');
      return true;
    }
    const finePath = /^\/fines\/([^/]+)$/.exec(pathname);
    if (!finePath) return false;
    if (!reading) allow('GET, HEAD');
    else {
      const id = /^[1-9]\d{0,8}$/.test(finePath[1]) ? Number(finePath[1]) : undefined;
      read(res, async () => (id === undefined ? undefined : database.getFine(id)));
    }
    return true;
  }

  return { handler: fineHandler, createFine };
}
