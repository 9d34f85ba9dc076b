import { createRequire } from 'node:module';
import { sqliteStore } from 'retrysafe/sqlite';
import { BOOKS, DEFAULT_INTENT_TTL_MS, MEMBERS } from './catalog.js';

const SCHEMA = `
  CREATE TABLE IF NOT EXISTS book (isbn TEXT PRIMARY KEY, title TEXT NOT NULL, author TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS member (id TEXT PRIMARY KEY, name TEXT NOT NULL);
  CREATE TABLE IF NOT EXISTS loan (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    member TEXT NOT NULL REFERENCES member (id),
    isbn TEXT NOT NULL REFERENCES book (isbn),
    issuedAt TEXT NOT NULL,
    "return" TEXT,
    intent TEXT,
    intent_until_ms INTEGER
  );
  CREATE TABLE IF NOT EXISTS fine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    member TEXT NOT NULL REFERENCES member (id),
    amount INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    charge_id TEXT,
    intent TEXT UNIQUE
  );
  CREATE TABLE IF NOT EXISTS receipt_job (
    loan_id INTEGER PRIMARY KEY REFERENCES loan (id) ON DELETE CASCADE,
    attempts INTEGER NOT NULL DEFAULT 0,
    claimed_until_ms INTEGER NOT NULL DEFAULT 0,
    done_at_ms INTEGER
  );
  -- Sent jobs stay; the outbox's claim reads only the unsent ones.
  CREATE INDEX IF NOT EXISTS receipt_job_pending ON receipt_job (loan_id) WHERE done_at_ms IS NULL;
  CREATE TABLE IF NOT EXISTS receipt (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    loan_id INTEGER NOT NULL REFERENCES loan (id) ON DELETE CASCADE,
    body TEXT NOT NULL,
    lease_key TEXT UNIQUE
  );`;
// The unique intent of a keyed loan (see postgres.js); a database made before it gains the column.
const INTENT_INDEX = 'CREATE UNIQUE INDEX IF NOT EXISTS loan_intent ON loan (intent)';
const LOAN_COLUMNS = 'id, member, isbn, issuedAt, "return"';
const FINE_COLUMNS = 'id, member, amount, status, charge_id AS chargeId';
// The desk's own secrets, made once (see `scopeSecret`).
const SECRET_TABLE = 'CREATE TABLE IF NOT EXISTS desk_secret (name TEXT PRIMARY KEY, value TEXT NOT NULL)';

/**
 * The loan desk's tables in a SQLite file, on the idempotency store's own connection so a keyed
 * loan commits in the store's transaction (atomic mode). Every write runs inside
 * `store.transaction`, which queues behind a transaction left open by a request in flight instead
 * of joining it (a keyless loan must not vanish with another request's rollback). Reads use a
 * second, read-only connection: in WAL mode it sees only committed loans and never waits for the
 * write lock. `setup: true` creates the file, the tables (the key store's too) and the catalog when missing; the process
 * that starts first runs it, later runs change nothing. Without it the file must exist. `now`,
 * when given, is the key store's clock (`npm run demo` moves it). `driver` (optional) picks
 * better-sqlite3 or node:sqlite; by default the store's choice. Only SQL both drivers run alike
 * is used here (no `pluck`, no `pragma`), so the desk runs on either.
 * @param {{ filename: string, setup?: boolean, now?: () => number, driver?: 'better-sqlite3' | 'node:sqlite' }} options
 */
export async function openSqlite({ filename, setup, now, driver }) {
  // Only a setup may create the file: anything else (`npm run purge`) on a mistyped path must fail
  // rather than leave an empty database there.
  const store = setup ? sqliteStore({ url: filename, now, driver, migrate: true }) : undefined;
  let reader;
  try {
    reader = openReader(filename, store?.driver ?? driver);
  } catch (error) {
    throw new Error(`cannot open the SQLite database ${filename}: ${error.message}`);
  }
  return openTables(store ?? sqliteStore({ url: filename, now, driver }), reader, { setup, now });
}

const load = createRequire(import.meta.url);

/**
 * A read-only connection of the store's driver (default: better-sqlite3 where installed), which
 * fails on a missing file instead of creating it.
 */
function openReader(filename, driver) {
  if (driver !== 'node:sqlite') {
    try {
      const Database = load('better-sqlite3');
      return new Database(filename, { readonly: true, fileMustExist: true });
    } catch (error) {
      if (driver === 'better-sqlite3' || error.code !== 'MODULE_NOT_FOUND') throw error;
    }
  }
  const { DatabaseSync } = load('node:sqlite');
  return new DatabaseSync(filename, { readOnly: true });
}

async function openTables(store, reader, { setup, now }) {
  const db = store.database;
  db.exec('PRAGMA foreign_keys = ON');
  if (setup) {
    await store.migrate();
    await store.transaction(() => {
      // A database made before its receipts' rows went with their loan: SQLite cannot alter a
      // foreign key, so those tables are made again and their rows copied over.
      const stale = ['receipt_job', 'receipt'].filter((table) =>
        db
          .prepare(
            `SELECT 1 FROM pragma_foreign_key_list(?) WHERE "table" = 'loan' AND on_delete <> 'CASCADE'`,
          )
          .get(table),
      );
      for (const table of stale) {
        db.exec(`DROP INDEX IF EXISTS receipt_job_pending; ALTER TABLE ${table} RENAME TO ${table}_old`);
      }
      db.exec(SCHEMA);
      for (const table of stale)
        db.exec(`INSERT INTO ${table} SELECT * FROM ${table}_old; DROP TABLE ${table}_old`);
      const columns = db
        .prepare('SELECT name FROM pragma_table_info(?)')
        .all('loan')
        .map((row) => row.name);
      if (!columns.includes('intent')) db.exec('ALTER TABLE loan ADD COLUMN intent TEXT');
      if (!columns.includes('intent_until_ms'))
        db.exec('ALTER TABLE loan ADD COLUMN intent_until_ms INTEGER');
      db.exec(INTENT_INDEX);
      db.exec(SECRET_TABLE);
      const book = db.prepare(
        'INSERT OR IGNORE INTO book (isbn, title, author) VALUES (@isbn, @title, @author)',
      );
      const member = db.prepare('INSERT OR IGNORE INTO member (id, name) VALUES (@id, @name)');
      for (const row of BOOKS) book.run(row);
      for (const row of MEMBERS) member.run(row);
    });
  }

  const bookExists = db.prepare('SELECT 1 FROM book WHERE isbn = ?');
  const memberExists = db.prepare('SELECT 1 FROM member WHERE id = ?');
  const insertLoan = db.prepare(
    `INSERT INTO loan (member, isbn, issuedAt, intent, intent_until_ms)
     VALUES (@member, @isbn, @issuedAt, @intent, @until)
     ON CONFLICT (intent) DO NOTHING RETURNING ${LOAN_COLUMNS}`,
  );
  const lentLoan = db.prepare(`SELECT ${LOAN_COLUMNS}, intent_until_ms FROM loan WHERE intent = ?`);
  const forgetIntent = db.prepare('UPDATE loan SET intent = NULL WHERE intent = ?');
  const insertFine = db.prepare(
    `INSERT INTO fine (member, amount, intent) VALUES (@member, @amount, @intent)
     ON CONFLICT (intent) DO NOTHING RETURNING ${FINE_COLUMNS}`,
  );
  const recordedFine = db.prepare(`SELECT ${FINE_COLUMNS} FROM fine WHERE intent = ?`);
  const payFine = db.prepare(
    `UPDATE fine SET status = 'paid', charge_id = @chargeId WHERE id = @id RETURNING ${FINE_COLUMNS}`,
  );
  const queueReceipt = db.prepare('INSERT INTO receipt_job (loan_id) VALUES (?)');
  const claimReceipts = db.prepare(
    `UPDATE receipt_job SET attempts = attempts + 1, claimed_until_ms = @until
     WHERE loan_id IN (SELECT loan_id FROM receipt_job
                       WHERE done_at_ms IS NULL AND claimed_until_ms <= @now ORDER BY loan_id LIMIT @limit)
     RETURNING loan_id AS loanId, attempts AS delivery`,
  );
  const claimedLoan = db.prepare('SELECT member, isbn, issuedAt FROM loan WHERE id = ?');
  const finishReceipt = db.prepare(
    'UPDATE receipt_job SET done_at_ms = ? WHERE loan_id = ? AND done_at_ms IS NULL',
  );
  const receiptsWaiting = reader.prepare(
    'SELECT 1 AS found FROM receipt_job WHERE done_at_ms IS NULL AND claimed_until_ms <= ? LIMIT 1',
  );
  const insertReceipt = db.prepare(
    'INSERT INTO receipt (loan_id, body, lease_key) VALUES (@loanId, @body, @leaseKey) ON CONFLICT (lease_key) DO NOTHING',
  );
  const receiptOf = reader.prepare(
    `SELECT j.attempts, r.body FROM receipt_job j LEFT JOIN receipt r ON r.loan_id = j.loan_id
     WHERE j.loan_id = ? ORDER BY r.id LIMIT 1`,
  );
  const clock = now ?? Date.now;
  const allLoans = reader.prepare(`SELECT ${LOAN_COLUMNS} FROM loan ORDER BY id`);
  const oneLoan = reader.prepare(`SELECT ${LOAN_COLUMNS} FROM loan WHERE id = ?`);
  const loanCount = reader.prepare('SELECT count(*) AS n FROM loan');
  const oneFine = reader.prepare(`SELECT ${FINE_COLUMNS} FROM fine WHERE id = ?`);
  const allFines = reader.prepare(`SELECT ${FINE_COLUMNS} FROM fine ORDER BY id`);
  const finesOf = reader.prepare(`SELECT ${FINE_COLUMNS} FROM fine WHERE member = ? ORDER BY id`);
  const readerMemberExists = reader.prepare('SELECT 1 AS found FROM member WHERE id = ?');
  const allBooks = reader.prepare('SELECT isbn, title, author FROM book ORDER BY isbn');
  const allMembers = reader.prepare('SELECT id, name FROM member ORDER BY id');

  /**
   * The loan's foreign keys check the catalog in its INSERT (the connection enforces them): only a
   * refused loan asks which reference is missing, so a loan runs two statements fewer.
   */
  function lend(loan, intent = null, intentTtlMs = DEFAULT_INTENT_TTL_MS) {
    try {
      return lendChecked(loan, intent, intentTtlMs);
    } catch (error) {
      if (!bookExists.get(loan.isbn)) return { missing: 'isbn' };
      if (!memberExists.get(loan.member)) return { missing: 'member' };
      throw error;
    }
  }

  /** See postgres.js: an intent holds its loan for `intentTtlMs`, then names a new one. */
  function lendChecked(loan, intent, intentTtlMs) {
    const nowMs = clock();
    const until = intent === null ? null : nowMs + intentTtlMs;
    const row = { member: loan.member, isbn: loan.isbn, issuedAt: loan.issuedAt, intent, until };
    const made = insertLoan.get(row);
    if (made) return { loan: withReceiptJob(made) };
    const { intent_until_ms: lentUntil, ...lent } = lentLoan.get(intent);
    if (lentUntil > nowMs) return { loan: lent };
    forgetIntent.run(intent);
    return { loan: withReceiptJob(insertLoan.get(row)) };
  }

  /** A new loan's receipt job, in the loan's transaction: it commits (or rolls back) with it. */
  function withReceiptJob(loan) {
    queueReceipt.run(loan.id);
    return loan;
  }

  return {
    store,
    /**
     * `tx` is the open atomic transaction (the connection itself) when the request has a key;
     * `intent` (optional) names the request's intent: a second loan for it within `intentTtlMs`
     * returns the first.
     */
    createLoan: (loan, { tx, intent, intentTtlMs } = {}) =>
      tx ? lend(loan, intent, intentTtlMs) : store.transaction(() => lend(loan, intent, intentTtlMs)),
    listLoans: async () => allLoans.all(),
    getLoan: async (id) => oneLoan.get(id),
    memberExists: async (id) => readerMemberExists.get(id) !== undefined,
    /**
     * Records a pending fine; a second call with its `intent` returns the first. `tx` is the
     * connection inside a phase's transaction (see postgres.js), absent for a step of its own.
     */
    recordFine: (fine, { tx, intent }) => {
      const record = () => insertFine.get({ ...fine, intent }) ?? recordedFine.get(intent);
      return tx ? record() : store.transaction(record);
    },
    /** Marks fine `id` paid by charge `chargeId`; again, it changes nothing. */
    markFinePaid: (id, chargeId, { tx } = {}) => {
      const pay = () => payFine.get({ id, chargeId });
      return tx ? pay() : store.transaction(pay);
    },
    /**
     * The receipts' outbox (see receipts.js): claims up to `limit` unsent jobs for `leaseMs` (a
     * job whose claimer died is claimed again once that passed), each with its delivery number
     * and its loan.
     */
    claimReceiptJobs: (limit, leaseMs) =>
      store.transaction(() =>
        claimReceipts
          .all({ now: clock(), until: clock() + leaseMs, limit })
          .map((job) => ({ ...job, ...claimedLoan.get(job.loanId) })),
      ),
    /** Whether a job waits unclaimed: a read, so a quiet outbox never takes the write lock. */
    receiptJobsWaiting: async () => receiptsWaiting.get(clock()) !== undefined,
    /**
     * Sends the outbox's `receipts` in one transaction: each is written only if its job is still
     * unsent, and its job is marked sent with it. Answers the loan ids written; another delivery
     * sent the rest, or their loan was deleted (its job with it).
     */
    recordReceipts: (receipts) =>
      store.transaction(() => {
        const written = new Set();
        for (const receipt of receipts) {
          if (finishReceipt.run(clock(), receipt.loanId).changes === 0) continue;
          insertReceipt.run({ loanId: receipt.loanId, body: JSON.stringify(receipt), leaseKey: null });
          written.add(receipt.loanId);
        }
        return written;
      }),
    /** Marks the jobs of `loanIds` done: BullMQ holds them now (receipts.js). */
    finishReceiptJobs: (loanIds) =>
      store.transaction(() => {
        for (const loanId of loanIds) finishReceipt.run(clock(), loanId);
      }),
    /** Writes a receipt on `tx` (atomic mode); `leaseKey` (lease mode) lets a second write do nothing. */
    recordReceipt: (receipt, { tx, leaseKey = null }) => {
      const write = () =>
        insertReceipt.run({ loanId: receipt.loanId, body: JSON.stringify(receipt), leaseKey });
      return tx ? write() : store.transaction(write);
    },
    /** `{ attempts, receipt }` of loan `id`'s receipt job (`receipt` once sent), or undefined. */
    getReceipt: async (id) => {
      const row = receiptOf.get(id);
      return row && { attempts: row.attempts, receipt: row.body === null ? undefined : JSON.parse(row.body) };
    },
    getFine: async (id) => oneFine.get(id),
    listFines: async (member) => (member === undefined ? allFines.all() : finesOf.all(member)),
    listBooks: async () => allBooks.all(),
    listMembers: async () => allMembers.all(),
    countLoans: async () => loanCount.get().n,
    /** The secret named `name`, made from `candidate` by the first process to ask; the same for all. */
    async secret(name, candidate) {
      await store.transaction(() =>
        db
          .prepare('INSERT INTO desk_secret (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING')
          .run(name, candidate),
      );
      return db.prepare('SELECT value FROM desk_secret WHERE name = ?').get(name).value;
    },
    close: async () => {
      reader.close();
      await store.close();
    },
  };
}
