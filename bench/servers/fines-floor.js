// The fines floor: POST /fines with the loan desk's guarantee written by hand, no library, on SQLite
// (brandur's rocket-rides-atomic shape). A key row holds the owner's token, its lease and the
// recovery point; three transactions move it on: (1) claim + the pending fine, (2) the charge's id
// once the provider answered, (3) the fine paid + the stored response. A retry after the lease took
// over resumes at the recovery point; the provider's key is derived from ours, so a second charge
// attempt replays the first. DATABASE_URL is the SQLite file, PROVIDER_URL the payment provider.
import { createHash, randomUUID } from 'node:crypto';
import http from 'node:http';
import Database from 'better-sqlite3';
import { MEMBERS } from '../../examples/library-loans/databases/catalog.js';
import { parseFine } from '../../examples/library-loans/fines.js';

const TTL_MS = 24 * 3600 * 1000;
const LEASE_MS = 10_000;
const KEY = /^[\x21-\x7e]{1,255}$/;
const PROVIDER_URL = process.env.PROVIDER_URL;

const db = new Database(process.env.DATABASE_URL);
db.pragma('journal_mode = WAL');
db.exec(`
  CREATE TABLE IF NOT EXISTS member (id TEXT PRIMARY KEY, name TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS fine (id INTEGER PRIMARY KEY AUTOINCREMENT, member TEXT NOT NULL,
    amount INTEGER NOT NULL, status TEXT NOT NULL, charge_id TEXT);
  CREATE TABLE IF NOT EXISTS fine_key (key TEXT PRIMARY KEY, fp TEXT NOT NULL, token TEXT NOT NULL,
    lease_until INTEGER NOT NULL, expires INTEGER NOT NULL, point TEXT NOT NULL, fine TEXT,
    charge TEXT, response TEXT)`);
const addMember = db.prepare('INSERT OR IGNORE INTO member VALUES (@id, @name)');
for (const row of MEMBERS) addMember.run(row);
const memberExists = db.prepare('SELECT 1 FROM member WHERE id = ?').pluck();
const keyRow = db.prepare('SELECT * FROM fine_key WHERE key = ?');
const claimNew = db.prepare(
  `INSERT INTO fine_key (key, fp, token, lease_until, expires, point) VALUES (?, ?, ?, ?, ?, 'started')
   ON CONFLICT (key) DO NOTHING`,
);
const takeOver = db.prepare('UPDATE fine_key SET token = ?, lease_until = ? WHERE key = ? AND token = ?');
const insertFine = db.prepare(
  "INSERT INTO fine (member, amount, status) VALUES (?, ?, 'pending') RETURNING id, member, amount, status, charge_id AS chargeId",
);
const payFine = db.prepare(
  "UPDATE fine SET status = 'paid', charge_id = ? WHERE id = ? RETURNING id, member, amount, status, charge_id AS chargeId",
);
const advance = db.prepare(
  'UPDATE fine_key SET point = ?, fine = coalesce(?, fine), charge = coalesce(?, charge), response = ? WHERE key = ? AND token = ?',
);

/** Claims the key or resumes it: the row to go on from, or what to answer instead. */
const claim = db.transaction((key, fp) => {
  const now = Date.now();
  const token = randomUUID();
  if (claimNew.run(key, fp, token, now + LEASE_MS, now + TTL_MS).changes === 1) {
    return { row: { point: 'started', token } };
  }
  const row = keyRow.get(key);
  if (row.fp !== fp) return { answer: [409, '{"error":"key_conflict"}'] };
  if (row.response) return { answer: [201, row.response, true] };
  if (row.lease_until > now) return { answer: [409, '{"error":"in_progress"}'] };
  takeOver.run(token, now + LEASE_MS, key, row.token);
  return { row: { ...row, token } };
}).immediate;

/** Phase 1: the pending fine, with the recovery point, in one transaction; fenced by the token. */
const record = db.transaction((key, token, fine) => {
  const made = insertFine.get(fine.member, fine.amount);
  if (advance.run('recorded', JSON.stringify(made), null, null, key, token).changes === 0)
    throw new Error('fenced');
  return made;
}).immediate;
const saveCharge = db.transaction((key, token, charge) => {
  if (advance.run('charged', null, JSON.stringify(charge), null, key, token).changes === 0)
    throw new Error('fenced');
}).immediate;
/** Phase 3: the fine paid and the response stored, in one transaction. */
const pay = db.transaction((key, token, fineId, chargeId) => {
  const paid = payFine.get(chargeId, fineId);
  const response = JSON.stringify(paid);
  if (advance.run('finished', null, null, response, key, token).changes === 0) throw new Error('fenced');
  return response;
}).immediate;

async function charge(fine, key) {
  const response = await fetch(`${PROVIDER_URL}/charges`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'idempotency-key': createHash('sha256').update(`${key}\ncharged`).digest('base64url'),
    },
    body: JSON.stringify({ amount: fine.amount, currency: 'eur', reference: String(fine.id) }),
    signal: AbortSignal.timeout(5000),
  });
  if (response.status !== 201) throw new Error(`provider answered ${response.status}`);
  return response.json();
}

function send(res, status, body, replayed = false) {
  const headers = { 'content-type': 'application/json; charset=utf-8' };
  if (replayed) headers['idempotency-replayed'] = 'true';
  res.writeHead(status, headers).end(body);
}

async function createFine(req, res, body) {
  const key = req.headers['idempotency-key'];
  if (typeof key !== 'string' || !KEY.test(key)) return send(res, 400, '{"error":"idempotency_key_missing"}');
  const { fine, problem } = parseFine(body);
  if (problem) return send(res, 400, JSON.stringify(problem));
  if (!memberExists.get(fine.member)) return send(res, 422, '{"error":"validation","field":"member"}');
  const fp = createHash('sha256').update(body).digest('hex');
  const { row, answer } = claim(key, fp);
  if (answer) return send(res, ...answer);
  try {
    const recorded = row.point === 'started' ? record(key, row.token, fine) : JSON.parse(row.fine);
    const charged = row.charge ? JSON.parse(row.charge) : await charge(recorded, key);
    if (!row.charge) saveCharge(key, row.token, charged);
    send(res, 201, pay(key, row.token, recorded.id, charged.id));
  } catch (error) {
    // The lease ends so a retry resumes at once; the recovery point stays.
    db.prepare('UPDATE fine_key SET lease_until = 0 WHERE key = ? AND token = ?').run(key, row.token);
    send(res, 503, JSON.stringify({ error: 'unavailable', message: error.message }));
  }
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    if (req.method !== 'POST' || req.url !== '/fines') return send(res, 404, '{"error":"path_not_found"}');
    createFine(req, res, Buffer.concat(chunks)).catch((error) =>
      send(res, 500, JSON.stringify(error.message)),
    );
  });
});
server.listen(0, '127.0.0.1', () => process.send?.({ ready: server.address().port }));
