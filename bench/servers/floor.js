// The floors: the least hand-written code that gives POST /loans the same validation and the same
// retry guarantee as the loan desk with retrysafe, and no library. They are what "close to the
// limit" means in the benchmark report. FLOOR picks one:
//   sqlite    one BEGIN IMMEDIATE: claim, loan, stored response, COMMIT (cached statements); a
//             POST with no key: the loan alone in one BEGIN IMMEDIATE (the desk's keyless POST)
//   postgres  one statement: claim with the response, the loan, in one round trip; a read to replay
//   postgres-3rt  a library's structure: BEGIN + claim, the handler's loan, response + COMMIT (3 trips)
//   mysql     BEGIN, INSERT IGNORE claim, the loan, the response, COMMIT (MySQL/MariaDB, one
//             connection per request; the least a hand-written transaction needs)
//   redis     SET NX PX claim, the loan (SQLite data, as the desk's Redis variant), SET the response
//   cheapest  a keyless POST that reads the body and answers a constant 201
// DATABASE_URL names the SQLite file, the PostgreSQL URL (`?schema=`) or the mysql:// URL; REDIS_URL
// the Redis server.
import { createHash } from 'node:crypto';
import http from 'node:http';
import Database from 'better-sqlite3';
import Redis from 'ioredis';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { parseLoan } from '../../examples/library-loans/app.js';
import { BOOKS, MEMBERS } from '../../examples/library-loans/databases/catalog.js';

const TTL_MS = 24 * 3600 * 1000;
const LEASE_MS = 10_000;
const JSON_TYPE = 'application/json; charset=utf-8';
const KEY = /^[\x21-\x7e]{1,255}$/;
const CONSTANT_201 = Buffer.from('{"ok":true}');

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => resolve(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

function send(res, status, body, headers = {}) {
  const bytes = typeof body === 'string' ? Buffer.from(body) : body;
  res.writeHead(status, { 'content-type': JSON_TYPE, 'content-length': bytes.length, ...headers });
  res.end(bytes);
}

/** The parts of an answer a floor stores and replays. */
const loanAnswer = (loan) => ({ status: 201, body: JSON.stringify(loan), location: `/loans/${loan.id}` });
const missingAnswer = (field, loan) => ({
  status: 422,
  body: JSON.stringify({ error: 'validation', field, message: `No ${field} ${loan[field]}.` }),
  location: null,
});

function sendStored(res, stored, replayed) {
  const headers = stored.location ? { location: stored.location } : {};
  if (replayed) headers['idempotency-replayed'] = 'true';
  send(res, stored.status, stored.body, headers);
}

const conflict = (res) => send(res, 409, '{"error":"key_conflict"}');
const busy = (res) => send(res, 409, '{"error":"in_progress"}', { 'retry-after': '1' });

function sqliteDatabase(filename) {
  const db = new Database(filename);
  db.pragma('journal_mode = WAL');
  db.exec(`
    CREATE TABLE IF NOT EXISTS book (isbn TEXT PRIMARY KEY, title TEXT NOT NULL, author TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS member (id TEXT PRIMARY KEY, name TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS loan (id INTEGER PRIMARY KEY AUTOINCREMENT, member TEXT NOT NULL,
      isbn TEXT NOT NULL, issuedAt TEXT NOT NULL, "return" TEXT);
    CREATE TABLE IF NOT EXISTS idem (scope TEXT NOT NULL, key TEXT NOT NULL, fp TEXT NOT NULL,
      expires INTEGER NOT NULL, status INTEGER, body TEXT, location TEXT, PRIMARY KEY (scope, key));`);
  const book = db.prepare('INSERT OR IGNORE INTO book VALUES (@isbn, @title, @author)');
  const member = db.prepare('INSERT OR IGNORE INTO member VALUES (@id, @name)');
  for (const row of BOOKS) book.run(row);
  for (const row of MEMBERS) member.run(row);
  const bookExists = db.prepare('SELECT 1 FROM book WHERE isbn = ?').pluck();
  const memberExists = db.prepare('SELECT 1 FROM member WHERE id = ?').pluck();
  const insertLoan = db.prepare(
    'INSERT INTO loan (member, isbn, issuedAt) VALUES (@member, @isbn, @issuedAt) RETURNING id, member, isbn, issuedAt',
  );
  /** The loan desk's own write: both references checked, then the loan. */
  const lend = (loan) => {
    if (!bookExists.get(loan.isbn)) return missingAnswer('isbn', loan);
    if (!memberExists.get(loan.member)) return missingAnswer('member', loan);
    return loanAnswer(insertLoan.get(loan));
  };
  return { db, lend };
}

function sqliteFloor(filename) {
  const { db, lend } = sqliteDatabase(filename);
  // A retention that passed makes the row a new operation: the upsert takes it over.
  const claim = db.prepare(`
    INSERT INTO idem (scope, key, fp, expires) VALUES (?, ?, ?, ?)
    ON CONFLICT (scope, key) DO UPDATE SET fp = excluded.fp, expires = excluded.expires,
      status = NULL, body = NULL, location = NULL
    WHERE idem.expires <= ?`);
  const existing = db.prepare('SELECT fp, status, body, location FROM idem WHERE scope = ? AND key = ?');
  const save = db.prepare('UPDATE idem SET status = ?, body = ?, location = ? WHERE scope = ? AND key = ?');
  const run = db.transaction((scope, key, fp, loan) => {
    const now = Date.now();
    if (claim.run(scope, key, fp, now + TTL_MS, now).changes === 0) {
      return { existing: existing.get(scope, key) };
    }
    const answer = lend(loan);
    save.run(answer.status, answer.body, answer.location, scope, key);
    return { answer };
  }).immediate;
  const lendAlone = db.transaction(lend).immediate;
  const guarded = async (res, scope, key, fp, loan) => {
    const result = run(scope, key, fp, loan);
    if (result.answer) return sendStored(res, result.answer, false);
    if (result.existing.fp !== fp) return conflict(res);
    sendStored(res, result.existing, true);
  };
  return Object.assign(guarded, { keyless: (res, loan) => sendStored(res, lendAlone(loan), false) });
}

/**
 * The loan desk's PostgreSQL tables (no foreign keys: the floors check both references themselves)
 * and the read that answers a key already taken: a replay, a conflict, or busy.
 */
async function postgresDatabase(databaseUrl, poolOptions = {}) {
  const url = new URL(databaseUrl);
  const schema = url.searchParams.get('schema') ?? 'public';
  url.searchParams.delete('schema');
  const pool = new pg.Pool({ connectionString: url.toString(), max: 10, ...poolOptions });
  const s = `"${schema}"`;
  await pool.query(`
    CREATE TABLE IF NOT EXISTS ${s}.book (isbn text PRIMARY KEY, title text NOT NULL, author text NOT NULL);
    CREATE TABLE IF NOT EXISTS ${s}.member (id text PRIMARY KEY, name text NOT NULL);
    CREATE TABLE IF NOT EXISTS ${s}.loan (id integer GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
      member text NOT NULL, isbn text NOT NULL, "issuedAt" text NOT NULL, "return" text);
    CREATE TABLE IF NOT EXISTS ${s}.idem (scope text NOT NULL, key text NOT NULL, fp text NOT NULL,
      expires timestamptz NOT NULL, status integer, body text, location text, PRIMARY KEY (scope, key))`);
  for (const row of BOOKS) {
    await pool.query(`INSERT INTO ${s}.book VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, [
      row.isbn,
      row.title,
      row.author,
    ]);
  }
  for (const row of MEMBERS) {
    await pool.query(`INSERT INTO ${s}.member VALUES ($1, $2) ON CONFLICT DO NOTHING`, [row.id, row.name]);
  }
  const EXISTING = {
    name: 'floor_existing',
    text: `SELECT fp, status, body, location FROM ${s}.idem WHERE scope = $1 AND key = $2 AND expires > now()`,
  };
  // A key's row holds its response from the moment it is visible: claim and response commit together.
  const answerTaken = async (res, scope, key, fp) => {
    const found = (await pool.query({ ...EXISTING, values: [scope, key] })).rows[0];
    // Expired and not yet purged: the bench never sends a key that old, so a floor need not renew it.
    if (!found) return busy(res);
    if (found.fp !== fp) return conflict(res);
    sendStored(res, found, true);
  };
  return { pool, s, answerTaken };
}

async function postgresFloor(databaseUrl) {
  const { pool, s, answerTaken } = await postgresDatabase(databaseUrl);
  // One statement is one transaction: the loan id is drawn first, so the claim row is inserted with
  // its final response, and the loan is inserted only when that claim went in. A concurrent
  // duplicate's ON CONFLICT waits for this statement to commit, then inserts nothing.
  const LEND = {
    name: 'floor_lend',
    text: `
    WITH refs AS (SELECT EXISTS (SELECT 1 FROM ${s}.book WHERE isbn = $5) AS book,
                         EXISTS (SELECT 1 FROM ${s}.member WHERE id = $4) AS member,
                         nextval(pg_get_serial_sequence('${s}.loan', 'id'))::int AS id),
         answer AS (SELECT CASE WHEN book AND member THEN 201 ELSE 422 END AS status,
                           CASE WHEN NOT book THEN json_build_object('error', 'validation', 'field', 'isbn',
                                     'message', 'No isbn ' || $5 || '.')::text
                                WHEN NOT member THEN json_build_object('error', 'validation', 'field', 'member',
                                     'message', 'No member ' || $4 || '.')::text
                                ELSE json_build_object('id', id, 'member', $4::text, 'isbn', $5::text,
                                     'issuedAt', $6::text)::text END AS body,
                           CASE WHEN book AND member THEN '/loans/' || id END AS location, id
                    FROM refs),
         claim AS (INSERT INTO ${s}.idem (scope, key, fp, expires, status, body, location)
                   SELECT $1, $2, $3, now() + interval '24 hours', status, body, location FROM answer
                   ON CONFLICT (scope, key) DO NOTHING
                   RETURNING status, body, location),
         loan AS (INSERT INTO ${s}.loan (id, member, isbn, "issuedAt")
                  SELECT answer.id, $4, $5, $6 FROM answer, claim WHERE claim.status = 201)
    SELECT status, body, location FROM claim`,
  };
  return async (res, scope, key, fp, loan) => {
    const { rows } = await pool.query({
      ...LEND,
      values: [scope, key, fp, loan.member, loan.isbn, loan.issuedAt],
    });
    if (rows.length === 1) return sendStored(res, rows[0], false);
    await answerTaken(res, scope, key, fp);
  };
}

/**
 * The structure a library must have, in the fewest round trips `pg` allows (pipeline mode sends a
 * query without waiting for the one before): BEGIN with the claim; the loan, as the handler's own
 * statement; the stored response with COMMIT. A concurrent duplicate's claim waits on the primary
 * key until this transaction ends, then inserts nothing and reads the committed response.
 */
async function postgresThreeTripFloor(databaseUrl) {
  const { pool, s, answerTaken } = await postgresDatabase(databaseUrl, { pipeline: true });
  const CLAIM = {
    name: 'floor3_claim',
    text: `INSERT INTO ${s}.idem (scope, key, fp, expires) VALUES ($1, $2, $3, now() + interval '24 hours')
      ON CONFLICT (scope, key) DO NOTHING`,
  };
  // The handler's statement: both references checked, and the loan only when both exist.
  const LEND = {
    name: 'floor3_lend',
    text: `WITH refs AS (SELECT EXISTS (SELECT 1 FROM ${s}.book WHERE isbn = $2) AS book,
                              EXISTS (SELECT 1 FROM ${s}.member WHERE id = $1) AS member),
      loan AS (INSERT INTO ${s}.loan (member, isbn, "issuedAt") SELECT $1, $2, $3 FROM refs
               WHERE book AND member RETURNING id, member, isbn, "issuedAt")
    SELECT book, member, (SELECT row_to_json(loan) FROM loan) AS loan FROM refs`,
  };
  const SAVE = {
    name: 'floor3_save',
    text: `UPDATE ${s}.idem SET status = $3, body = $4, location = $5 WHERE scope = $1 AND key = $2`,
  };
  return async (res, scope, key, fp, loan) => {
    const client = await pool.connect();
    let answer;
    try {
      const [, claim] = await Promise.all([
        client.query('BEGIN'),
        client.query({ ...CLAIM, values: [scope, key, fp] }),
      ]);
      if (claim.rowCount === 1) {
        const [row] = (await client.query({ ...LEND, values: [loan.member, loan.isbn, loan.issuedAt] })).rows;
        if (!row.book) answer = missingAnswer('isbn', loan);
        else if (!row.member) answer = missingAnswer('member', loan);
        else answer = loanAnswer(row.loan);
        await Promise.all([
          client.query({ ...SAVE, values: [scope, key, answer.status, answer.body, answer.location] }),
          client.query('COMMIT'),
        ]);
      } else await client.query('ROLLBACK');
      client.release();
    } catch (error) {
      client.release(error);
      throw error;
    }
    if (answer) return sendStored(res, answer, false);
    await answerTaken(res, scope, key, fp);
  };
}

/**
 * MySQL/MariaDB: the claim (its row inserted or ignored), the handler's loan with both references
 * checked in its statement, the saved response, one transaction. A key taken already is answered
 * from its row, outside any transaction.
 */
async function mysqlFloor(databaseUrl) {
  const url = new URL(databaseUrl);
  const name = url.pathname.slice(1);
  url.pathname = '/';
  const admin = await mysql.createConnection({ uri: url.toString() });
  await admin.query(`CREATE DATABASE IF NOT EXISTS \`${name}\``);
  await admin.end();
  const pool = mysql.createPool({ uri: databaseUrl, connectionLimit: 10 });
  await pool.query(
    `CREATE TABLE IF NOT EXISTS book (isbn varchar(32) PRIMARY KEY, title text NOT NULL, author text NOT NULL)`,
  );
  await pool.query('CREATE TABLE IF NOT EXISTS member (id varchar(32) PRIMARY KEY, name text NOT NULL)');
  await pool.query(`CREATE TABLE IF NOT EXISTS loan (id int AUTO_INCREMENT PRIMARY KEY, member varchar(32) NOT NULL,
    isbn varchar(32) NOT NULL, issuedAt text NOT NULL, \`return\` text)`);
  await pool.query(`CREATE TABLE IF NOT EXISTS idem (scope varbinary(255) NOT NULL, \`key\` varbinary(255) NOT NULL,
    fp varchar(64) NOT NULL, expires bigint NOT NULL, status int, body text, location text, PRIMARY KEY (scope, \`key\`))`);
  await pool.query('INSERT IGNORE INTO book VALUES ?', [BOOKS.map((b) => [b.isbn, b.title, b.author])]);
  await pool.query('INSERT IGNORE INTO member VALUES ?', [MEMBERS.map((m) => [m.id, m.name])]);
  return async (res, scope, key, fp, loan) => {
    const connection = await pool.getConnection();
    let answer;
    try {
      await connection.beginTransaction();
      const [claim] = await connection.query(
        'INSERT IGNORE INTO idem (scope, `key`, fp, expires) VALUES (?, ?, ?, ?)',
        [scope, key, fp, Date.now() + TTL_MS],
      );
      if (claim.affectedRows === 1) {
        const [lent] = await connection.query(
          `INSERT INTO loan (member, isbn, issuedAt) SELECT ?, ?, ? FROM DUAL
           WHERE EXISTS (SELECT 1 FROM book WHERE isbn = ?) AND EXISTS (SELECT 1 FROM member WHERE id = ?)`,
          [loan.member, loan.isbn, loan.issuedAt, loan.isbn, loan.member],
        );
        if (lent.affectedRows === 1) answer = loanAnswer({ id: lent.insertId, ...loan });
        else {
          const [[refs]] = await connection.query(
            'SELECT EXISTS (SELECT 1 FROM book WHERE isbn = ?) AS book',
            [loan.isbn],
          );
          answer = missingAnswer(refs.book ? 'member' : 'isbn', loan);
        }
        await connection.query(
          'UPDATE idem SET status = ?, body = ?, location = ? WHERE scope = ? AND `key` = ?',
          [answer.status, answer.body, answer.location, scope, key],
        );
        await connection.commit();
      } else await connection.rollback();
      connection.release();
    } catch (error) {
      connection.destroy();
      throw error;
    }
    if (answer) return sendStored(res, answer, false);
    const [[found]] = await pool.query(
      'SELECT fp, status, body, location FROM idem WHERE scope = ? AND `key` = ?',
      [scope, key],
    );
    if (!found?.status) return busy(res);
    if (found.fp !== fp) return conflict(res);
    sendStored(res, found, true);
  };
}

function redisFloor(filename, redisUrl) {
  const { db, lend } = sqliteDatabase(filename);
  const write = db.transaction(lend).immediate;
  const redis = new Redis(redisUrl);
  return async (res, scope, key, fp, loan) => {
    const name = `floor:${scope}:${key}`;
    // In progress: the fingerprint alone. Completed: fingerprint, then the stored answer as JSON.
    if ((await redis.set(name, fp, 'PX', LEASE_MS, 'NX')) === 'OK') {
      let answer;
      try {
        answer = write(loan);
      } catch (error) {
        await redis.del(name);
        throw error;
      }
      await redis.set(name, `${fp}\n${JSON.stringify(answer)}`, 'PX', TTL_MS);
      return sendStored(res, answer, false);
    }
    const found = await redis.get(name);
    if (found === null) return busy(res);
    const newline = found.indexOf('\n');
    if ((newline === -1 ? found : found.slice(0, newline)) !== fp) return conflict(res);
    if (newline === -1) return busy(res);
    sendStored(res, JSON.parse(found.slice(newline + 1)), true);
  };
}

const floor = process.env.FLOOR;
const databaseUrl = process.env.DATABASE_URL;
let guarded;
if (floor === 'sqlite') guarded = sqliteFloor(databaseUrl);
else if (floor === 'postgres') guarded = await postgresFloor(databaseUrl);
else if (floor === 'postgres-3rt') guarded = await postgresThreeTripFloor(databaseUrl);
else if (floor === 'mysql') guarded = await mysqlFloor(databaseUrl);
else if (floor === 'redis') guarded = redisFloor(databaseUrl, process.env.REDIS_URL);
else if (floor !== 'cheapest')
  throw new Error(`FLOOR must be sqlite, postgres, postgres-3rt, mysql, redis or cheapest; got ${floor}`);

const server = http.createServer(async (req, res) => {
  if (req.method !== 'POST' || req.url !== '/loans') return send(res, 404, '{"error":"path_not_found"}');
  try {
    const body = await readBody(req);
    if (floor === 'cheapest') return send(res, 201, CONSTANT_201);
    const header = req.headers['idempotency-key'];
    const keyless = header === undefined && guarded.keyless;
    if (!keyless && (header === undefined || !KEY.test(header)))
      return send(res, 400, '{"error":"idempotency_key_invalid"}');
    const { loan, problem } = parseLoan(body);
    if (problem) return send(res, 400, JSON.stringify(problem));
    if (keyless) return guarded.keyless(res, loan);
    const credential = req.headers.authorization;
    const scope = credential ? createHash('sha256').update(credential).digest('base64url') : 'anonymous';
    const fp = createHash('sha256').update(`POST /loans\n`).update(body).digest('hex');
    await guarded(res, scope, header, fp, loan);
  } catch (error) {
    if (!res.headersSent) send(res, 503, JSON.stringify({ error: 'unavailable', message: error.message }));
  }
});
server.listen(0, '127.0.0.1', () => process.send?.({ ready: server.address().port }));
process.once('SIGTERM', () => process.exit(0));
