import { sqliteStore } from 'retrysafe/sqlite';
import { BOOKS, MEMBERS } from './catalog.js';

const SCHEMA = `
  CREATE TABLE IF NOT EXISTS book (isbn TEXT PRIMARY KEY, title TEXT NOT NULL, author TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS member (id TEXT PRIMARY KEY, name TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS loan (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    member TEXT NOT NULL REFERENCES member (id),
    isbn TEXT NOT NULL REFERENCES book (isbn),
    issuedAt TEXT NOT NULL,
    "return" TEXT
  );`;
const LOAN_COLUMNS = 'id, member, isbn, issuedAt, "return"';

/**
 * The loan desk's tables in a SQLite file, on the idempotency store's own connection so a keyed
 * loan commits in the store's transaction (atomic mode). Every statement runs inside
 * `store.transaction`, which queues behind a transaction left open by a request in flight instead
 * of joining it (a keyless loan must not vanish with another request's rollback, and a read must
 * not see a loan that is not committed yet). `setup: true` creates the tables and the catalog
 * when missing; the process that starts first runs it, later runs change nothing.
 */
export async function openSqlite({ filename, setup }) {
  const store = sqliteStore({ filename });
  const db = store.database;
  db.pragma('foreign_keys = ON');
  if (setup) {
    await store.transaction(() => {
      db.exec(SCHEMA);
      const book = db.prepare(
        'INSERT OR IGNORE INTO book (isbn, title, author) VALUES (@isbn, @title, @author)',
      );
      const member = db.prepare('INSERT OR IGNORE INTO member (id, name) VALUES (@id, @name)');
      for (const row of BOOKS) book.run(row);
      for (const row of MEMBERS) member.run(row);
    });
  }

  const bookExists = db.prepare('SELECT 1 FROM book WHERE isbn = ?').pluck();
  const memberExists = db.prepare('SELECT 1 FROM member WHERE id = ?').pluck();
  const insertLoan = db.prepare(
    `INSERT INTO loan (member, isbn, issuedAt) VALUES (@member, @isbn, @issuedAt) RETURNING ${LOAN_COLUMNS}`,
  );
  const allLoans = db.prepare(`SELECT ${LOAN_COLUMNS} FROM loan ORDER BY id`);
  const oneLoan = db.prepare(`SELECT ${LOAN_COLUMNS} FROM loan WHERE id = ?`);
  const loanCount = db.prepare('SELECT count(*) FROM loan').pluck();
  const allBooks = db.prepare('SELECT isbn, title, author FROM book ORDER BY isbn');

  function lend(loan) {
    if (!bookExists.get(loan.isbn)) return { missing: 'isbn' };
    if (!memberExists.get(loan.member)) return { missing: 'member' };
    return { loan: insertLoan.get(loan) };
  }

  return {
    store,
    /** `tx` is the open atomic transaction (the connection itself) when the request has a key. */
    createLoan: (loan, tx) => (tx ? lend(loan) : store.transaction(() => lend(loan))),
    listLoans: () => store.transaction(() => allLoans.all()),
    getLoan: (id) => store.transaction(() => oneLoan.get(id)),
    listBooks: () => store.transaction(() => allBooks.all()),
    countLoans: () => store.transaction(() => loanCount.get()),
    close: () => store.close(),
  };
}
