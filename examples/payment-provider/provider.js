import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { idempotency } from 'retrysafe/node';
import { sqliteStore } from 'retrysafe/sqlite';
import { parseJsonObject } from '../json-object.js';

const SCHEMA = `CREATE TABLE IF NOT EXISTS charge (
  id TEXT PRIMARY KEY,
  amount INTEGER NOT NULL,
  currency TEXT NOT NULL,
  reference TEXT NOT NULL,
  created_ms INTEGER NOT NULL)`;
const CURRENCY = /^[a-z]{3}$/;
const REFERENCE = /^[^\p{Cc}]{1,128}$/u;
const MAX_AMOUNT = 99_999_999;

function send(res, status, payload, headers = {}) {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', ...headers });
  res.end(JSON.stringify(payload));
}

/** Checks the body of `POST /charges`; a `problem` is answered with 400 and nothing is charged. */
export function parseCharge(body) {
  const { value, problem } = parseJsonObject(body, 'Send {"amount", "currency", "reference"}.');
  if (problem) return { problem };
  const invalid = (field, message) => ({ problem: { error: 'validation', field, message } });
  const { amount, currency, reference } = value;
  if (!Number.isInteger(amount) || amount < 1 || amount > MAX_AMOUNT) {
    return invalid('amount', `amount must be an integer number of cents from 1 to ${MAX_AMOUNT}.`);
  }
  if (typeof currency !== 'string' || !CURRENCY.test(currency)) {
    return invalid('currency', 'currency must be a three-letter lower-case ISO code, like "eur".');
  }
  if (typeof reference !== 'string' || !REFERENCE.test(reference)) {
    return invalid(
      'reference',
      'reference must be a string of 1 to 128 characters, none a control character.',
    );
  }
  return { charge: { amount, currency, reference } };
}

/**
 * A toy payment provider, the loan desk's counterpart for fines: `POST /charges` makes a charge,
 * `GET /charges` lists them all. It is what the desk must not charge twice, so it behaves like
 * Stripe: a retry with the same `Idempotency-Key` replays the first charge instead of making
 * another, here with retrysafe in atomic mode (the charge commits with its key's saved answer,
 * in one SQLite transaction). A request without a key is a new charge every time.
 */
export function openProvider({ filename }) {
  const store = sqliteStore({ url: filename, migrate: true });
  const db = store.database;
  db.exec(SCHEMA);
  const insert = db.prepare(
    `INSERT INTO charge (id, amount, currency, reference, created_ms)
     VALUES (@id, @amount, @currency, @reference, @createdMs) RETURNING id, amount, currency, reference`,
  );
  const all = db.prepare('SELECT id, amount, currency, reference FROM charge ORDER BY created_ms, id');
  const makeCharge = (charge) =>
    insert.get({ ...charge, id: `ch_${randomBytes(12).toString('hex')}`, createdMs: Date.now() });

  const guard = idempotency({ store, mode: 'atomic' });
  const createCharge = guard(async function createCharge(req, res, idem) {
    const { charge, problem } = parseCharge(req.body);
    if (problem) return send(res, 400, problem);
    // In atomic mode `idem.tx` is the connection inside the claim's transaction.
    const made = idem ? makeCharge(charge) : await store.transaction(() => makeCharge(charge));
    send(res, 201, made, { location: `/charges/${made.id}` });
  });

  function providerHandler(req, res) {
    const { pathname } = new URL(req.url ?? '/', 'http://provider');
    if (pathname !== '/charges') return send(res, 404, { error: 'path_not_found' });
    if (req.method === 'POST') return createCharge(req, res);
    if (req.method === 'GET') return send(res, 200, all.all());
    send(res, 405, { error: 'method_not_allowed', allow: 'GET, POST' }, { allow: 'GET, POST' });
  }

  return { handler: providerHandler, close: () => store.close() };
}

/** Serves the provider on `host`:`port` (0: a free one); resolves with its URL and `close()`. */
export async function startProvider({ host, port, filename }) {
  const provider = openProvider({ filename });
  const server = http.createServer(provider.handler);
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const address = server.address();
  const shownHost = host.includes(':') ? `[${host}]` : host;
  return {
    url: `http://${shownHost}:${address.port}`,
    async close() {
      await new Promise((resolve) => {
        server.close(resolve);
        server.closeIdleConnections();
      });
      await provider.close();
    },
  };
}
