import { randomBytes } from 'node:crypto';
import mysql from 'mysql2/promise';
import { mysqlStore } from 'retrysafe/mysql';
import { BOOKS, DEFAULT_INTENT_TTL_MS, MEMBERS } from './catalog.js';

const TABLES = [
  `CREATE TABLE IF NOT EXISTS book (isbn varchar(32) PRIMARY KEY, title text NOT NULL, author text NOT NULL)`,
  `CREATE TABLE IF NOT EXISTS member (id varchar(32) PRIMARY KEY, name text NOT NULL)`,
  `CREATE TABLE IF NOT EXISTS loan (
    id int AUTO_INCREMENT PRIMARY KEY,
    member varchar(32) NOT NULL,
    isbn varchar(32) NOT NULL,
    issuedAt text NOT NULL,
    \`return\` text,
    intent varbinary(255) UNIQUE,
    intent_until_ms bigint,
    FOREIGN KEY (member) REFERENCES member (id),
    FOREIGN KEY (isbn) REFERENCES book (isbn))`,
  `CREATE TABLE IF NOT EXISTS receipt_job (
    loan_id int PRIMARY KEY,
    attempts int NOT NULL DEFAULT 0,
    claimed_until_ms bigint NOT NULL DEFAULT 0,
    claim varbinary(32),
    done_at_ms bigint,
    KEY receipt_job_pending (done_at_ms, loan_id),
    FOREIGN KEY (loan_id) REFERENCES loan (id) ON DELETE CASCADE)`,
  `CREATE TABLE IF NOT EXISTS receipt (
    id int AUTO_INCREMENT PRIMARY KEY,
    loan_id int NOT NULL,
    body json NOT NULL,
    lease_key varbinary(255) UNIQUE,
    FOREIGN KEY (loan_id) REFERENCES loan (id) ON DELETE CASCADE)`,
  // The desk's own secrets, made once (see `secret`).
  'CREATE TABLE IF NOT EXISTS desk_secret (name varchar(64) PRIMARY KEY, value text NOT NULL)',
];
const LOAN_COLUMNS = 'id, member, isbn, issuedAt, `return`';
const NOW_MS = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)";

/**
 * The loan desk's tables in MySQL or MariaDB, next to the idempotency store's table in the URL's
 * database. The store's pool serves the desk's own queries; a keyed loan runs on the connection
 * holding the atomic transaction (`tx`), so it commits with the claim and the saved response or
 * not at all. In lease mode a keyed loan carries its `intent` (unique), as in postgres.js.
 * `setup: true` creates the database, the store's table, the desk's tables and the catalog when
 * missing; several instances starting at once take turns on a named lock.
 */
export async function openMysql({ url, setup }) {
  const name = decodeURIComponent(new URL(url).pathname.slice(1));
  if (setup) {
    const server = new URL(url);
    server.pathname = '/';
    const admin = await mysql.createConnection({ uri: server.toString() });
    try {
      await admin.query(`CREATE DATABASE IF NOT EXISTS \`${name.replaceAll('`', '``')}\``);
    } finally {
      await admin.end();
    }
  }
  const store = mysqlStore({ url: url });
  const { pool } = store;
  if (setup) {
    await store.migrate();
    const connection = await pool.getConnection();
    try {
      await connection.query("SELECT GET_LOCK('library_loans_setup', 30)");
      for (const statement of TABLES) await connection.query(statement);
      // A database made before a loan's receipt job and receipt went with it.
      const [stale] = await connection.query(
        `SELECT TABLE_NAME AS tableName, CONSTRAINT_NAME AS name FROM information_schema.REFERENTIAL_CONSTRAINTS
         WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME IN ('receipt_job', 'receipt')
           AND REFERENCED_TABLE_NAME = 'loan' AND DELETE_RULE <> 'CASCADE'`,
      );
      for (const { tableName, name } of stale) {
        await connection.query(
          `ALTER TABLE ${tableName} DROP FOREIGN KEY \`${name}\`, ADD FOREIGN KEY (loan_id) REFERENCES loan (id) ON DELETE CASCADE`,
        );
      }
      await connection.query('INSERT IGNORE INTO book (isbn, title, author) VALUES ?', [
        BOOKS.map((b) => [b.isbn, b.title, b.author]),
      ]);
      await connection.query('INSERT IGNORE INTO member (id, name) VALUES ?', [
        MEMBERS.map((m) => [m.id, m.name]),
      ]);
    } finally {
      await connection.query("SELECT RELEASE_LOCK('library_loans_setup')").catch(() => {});
      connection.release();
    }
  }

  const rows = async (sql, values) => (await pool.query(sql, values))[0];
  /** Runs `work(connection)` in a transaction of its own: committed if it returns, rolled back if it throws. */
  async function inTransaction(work) {
    const connection = await pool.getConnection();
    let result;
    try {
      await connection.beginTransaction();
      result = await work(connection);
      await connection.commit();
    } catch (error) {
      await connection.rollback().catch(() => {});
      throw error;
    } finally {
      connection.release();
    }
    return result;
  }

  /** See postgres.js: an intent holds its loan for `intentTtlMs`, then names a new one. */
  async function lend(on, loan, { intent, intentTtlMs = DEFAULT_INTENT_TTL_MS }) {
    for (let attempt = 0; ; attempt++) {
      // IGNORE skips an intent lent already (its loan is read below); the references are
      // checked in the same statement.
      const [inserted] = await on.query(
        `INSERT IGNORE INTO loan (member, isbn, issuedAt, intent, intent_until_ms)
           SELECT ?, ?, ?, ?, ${NOW_MS} + ? FROM DUAL
           WHERE EXISTS (SELECT 1 FROM book WHERE isbn = ?) AND EXISTS (SELECT 1 FROM member WHERE id = ?)`,
        [
          loan.member,
          loan.isbn,
          loan.issuedAt,
          intent ?? null,
          intent === undefined ? null : intentTtlMs,
          loan.isbn,
          loan.member,
        ],
      );
      if (inserted.affectedRows === 1) {
        await on.query('INSERT INTO receipt_job (loan_id) VALUES (?)', [inserted.insertId]);
        return {
          loan: {
            id: inserted.insertId,
            member: loan.member,
            isbn: loan.isbn,
            issuedAt: loan.issuedAt,
            return: null,
          },
        };
      }
      const [[refs]] = await on.query(
        'SELECT EXISTS (SELECT 1 FROM book WHERE isbn = ?) AS book, EXISTS (SELECT 1 FROM member WHERE id = ?) AS member',
        [loan.isbn, loan.member],
      );
      if (!refs.book) return { missing: 'isbn' };
      if (!refs.member) return { missing: 'member' };
      const [[{ lapsed, ...lent } = { lapsed: 1 }]] = await on.query(
        `SELECT ${LOAN_COLUMNS}, intent_until_ms <= ${NOW_MS} AS lapsed FROM loan WHERE intent = ?`,
        [intent],
      );
      if (!lapsed || attempt === 2) return { loan: lent };
      await on.query(`UPDATE loan SET intent = NULL WHERE intent = ? AND intent_until_ms <= ${NOW_MS}`, [
        intent,
      ]);
    }
  }

  return {
    store,
    /** A new loan and its receipt job commit together: on `tx` when given, else in a transaction of their own. */
    createLoan: (loan, options = {}) =>
      options.tx
        ? lend(options.tx, loan, options)
        : inTransaction((connection) => lend(connection, loan, options)),
    listLoans: () => rows(`SELECT ${LOAN_COLUMNS} FROM loan ORDER BY id`),
    getLoan: async (id) => (await rows(`SELECT ${LOAN_COLUMNS} FROM loan WHERE id = ?`, [id]))[0],
    /**
     * The receipts' outbox, as in sqlite.js. MySQL has no UPDATE … RETURNING: a claim marks its
     * rows with a token of its own, then reads them back.
     */
    async claimReceiptJobs(limit, leaseMs) {
      const claim = randomBytes(16);
      await pool.query(
        `UPDATE receipt_job SET attempts = attempts + 1, claimed_until_ms = ${NOW_MS} + ?, claim = ?
         WHERE done_at_ms IS NULL AND claimed_until_ms <= ${NOW_MS} ORDER BY loan_id LIMIT ?`,
        [leaseMs, claim, limit],
      );
      return rows(
        `SELECT j.loan_id AS loanId, j.attempts AS delivery, l.member, l.isbn, l.issuedAt
         FROM receipt_job j JOIN loan l ON l.id = j.loan_id WHERE j.claim = ?`,
        [claim],
      );
    },
    receiptJobsWaiting: async () =>
      (
        await rows(
          `SELECT 1 FROM receipt_job WHERE done_at_ms IS NULL AND claimed_until_ms <= ${NOW_MS} LIMIT 1`,
        )
      ).length === 1,
    /** As in sqlite.js; the jobs still unsent are locked first, so a concurrent delivery waits, then finds them sent. */
    recordReceipts: (receipts) =>
      inTransaction(async (connection) => {
        const [unsent] = await connection.query(
          'SELECT loan_id FROM receipt_job WHERE loan_id IN (?) AND done_at_ms IS NULL FOR UPDATE',
          [receipts.map((receipt) => receipt.loanId)],
        );
        const written = new Set(unsent.map((row) => row.loan_id));
        if (written.size > 0) {
          await connection.query(`UPDATE receipt_job SET done_at_ms = ${NOW_MS} WHERE loan_id IN (?)`, [
            [...written],
          ]);
          await connection.query('INSERT INTO receipt (loan_id, body) VALUES ?', [
            receipts
              .filter((receipt) => written.has(receipt.loanId))
              .map((receipt) => [receipt.loanId, JSON.stringify(receipt)]),
          ]);
        }
        return written;
      }),
    finishReceiptJobs: (loanIds) =>
      pool.query(`UPDATE receipt_job SET done_at_ms = ${NOW_MS} WHERE loan_id IN (?)`, [loanIds]),
    recordReceipt: (receipt, { tx, leaseKey = null }) =>
      (tx ?? pool).query('INSERT IGNORE INTO receipt (loan_id, body, lease_key) VALUES (?, ?, ?)', [
        receipt.loanId,
        JSON.stringify(receipt),
        leaseKey,
      ]),
    async getReceipt(id) {
      const [row] = await rows(
        `SELECT j.attempts, r.body FROM receipt_job j LEFT JOIN receipt r ON r.loan_id = j.loan_id
         WHERE j.loan_id = ? ORDER BY r.id LIMIT 1`,
        [id],
      );
      const body = typeof row?.body === 'string' ? JSON.parse(row.body) : row?.body;
      return row && { attempts: row.attempts, receipt: body ?? undefined };
    },
    listBooks: () => rows('SELECT isbn, title, author FROM book ORDER BY isbn'),
    listMembers: () => rows('SELECT id, name FROM member ORDER BY id'),
    countLoans: async () => Number((await rows('SELECT count(*) AS n FROM loan'))[0].n),
    /**
     * The secret named `name`, made from `candidate` by the first process to ask: a racing one's
     * insert does nothing, and every process then reads the one row.
     */
    async secret(name, candidate) {
      await pool.query('INSERT IGNORE INTO desk_secret (name, value) VALUES (?, ?)', [name, candidate]);
      return (await rows('SELECT value FROM desk_secret WHERE name = ?', [name]))[0].value;
    },
    close: () => store.close(),
  };
}
