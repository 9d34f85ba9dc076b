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
  const store = mysqlStore({ uri: url });
  const { pool } = store;
  if (setup) {
    await store.migrate();
    const connection = await pool.getConnection();
    try {
      await connection.query("SELECT GET_LOCK('library_loans_setup', 30)");
      for (const statement of TABLES) await connection.query(statement);
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

  return {
    store,
    /** See postgres.js: an intent holds its loan for `intentTtlMs`, then names a new one. */
    async createLoan(loan, { tx, intent, intentTtlMs = DEFAULT_INTENT_TTL_MS } = {}) {
      const on = tx ?? pool;
      for (let attempt = 0; ; attempt++) {
        // IGNORE skips an intent lent already (its loan is read below); the references are
        // checked in the same statement, so a keyless loan needs no transaction.
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
    },
    listLoans: () => rows(`SELECT ${LOAN_COLUMNS} FROM loan ORDER BY id`),
    getLoan: async (id) => (await rows(`SELECT ${LOAN_COLUMNS} FROM loan WHERE id = ?`, [id]))[0],
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
