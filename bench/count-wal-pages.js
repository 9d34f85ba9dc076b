// node bench/count-wal-pages.js [--requests N] [--warmup N] [--mode atomic|lease]
// WAL frames (database pages written) per fresh-key POST /loans, for the loan desk on SQLite and
// the hand-written floor (servers/floor.js, FLOOR=sqlite), each B-tree's share listed: a count,
// not a time. A read transaction held open on a connection of its own during the counted requests
// keeps every checkpoint from resetting the WAL, so the file holds each commit's frames; each
// frame's page number is then named by the `dbstat` table (better-sqlite3 is built with it).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import Database from 'better-sqlite3';
import { loanDriver } from './lib/loan-driver.js';
import { FLOOR, LOAN_DESK } from './lib/loandesk.js';
import { startServer } from './lib/proc.js';

const { values } = parseArgs({
  options: {
    requests: { type: 'string', default: '300' },
    warmup: { type: 'string', default: '1000' },
    mode: { type: 'string', default: 'atomic' },
  },
});
const requests = Number(values.requests);
const warmup = Number(values.warmup);
const WAL_HEADER = 32;
const FRAME_HEADER = 24;

/** Frames per commit of the last `requests` commits in the WAL, by the B-tree each page is in. */
async function count(label, script, env) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'wal-pages-'));
  const file = path.join(dir, 'db.sqlite');
  // The floor reports its port over IPC; the desk is given one and polled (lib/proc.js).
  const server = await startServer(script, {
    env: { ...env, DATABASE_URL: file },
    ipcReady: script === FLOOR,
  });
  const load = loanDriver(server.url, 'wal');
  let wal;
  try {
    await load.send('fresh', warmup);
    const pin = new Database(file, { readonly: true });
    pin.exec('BEGIN');
    pin.prepare('SELECT count(*) FROM sqlite_master').get();
    await load.send('fresh', requests);
    wal = readFileSync(`${file}-wal`);
    pin.exec('COMMIT');
    pin.close();
  } finally {
    load.close();
    await server.stop();
  }
  const pageSize = wal.readUInt32BE(8);
  const frameSize = FRAME_HEADER + pageSize;
  const frames = Math.floor((wal.length - WAL_HEADER) / frameSize);
  // Walk back from the last frame over `requests` commit frames (a commit frame's second word is
  // the database size, non-zero); an older WAL generation's frames past the end are not read.
  const pages = [];
  let commits = 0;
  for (let i = frames - 1; i >= 0; i--) {
    const offset = WAL_HEADER + i * frameSize;
    if (wal.readUInt32BE(offset + 4) !== 0) {
      if (commits === requests) break;
      commits++;
    }
    pages.push(wal.readUInt32BE(offset));
  }
  const db = new Database(file, { readonly: true });
  const names = new Map(
    db
      .prepare('SELECT name, pageno FROM dbstat')
      .all()
      .map((r) => [r.pageno, r.name]),
  );
  db.close();
  rmSync(dir, { recursive: true, force: true });
  const byTree = new Map();
  for (const page of pages) {
    const name = page === 1 ? 'page 1 (header, sqlite_schema)' : (names.get(page) ?? `page ${page}`);
    byTree.set(name, (byTree.get(name) ?? 0) + 1);
  }
  console.log(`${label}: ${(pages.length / commits).toFixed(2)} pages per commit (${commits} commits)`);
  for (const [name, n] of [...byTree].sort((a, b) => b[1] - a[1])) {
    console.log(`  ${name.padEnd(40)} ${(n / commits).toFixed(3)}`);
  }
}

// RECEIPTS=0: the count walks back one commit per request, and the receipts' batches would be
// commits of their own (their cost is overhead's RECEIPTS=0 row).
await count(`loan desk, SQLite ${values.mode}`, LOAN_DESK, { IDEMPOTENCY_MODE: values.mode, RECEIPTS: '0' });
await count('floor (sqlite)', FLOOR, { FLOOR: 'sqlite' });
