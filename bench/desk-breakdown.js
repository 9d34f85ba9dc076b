// node bench/desk-breakdown.js [--requests N] [--rounds N] [--warmup N] [--profile DIR]
// Server CPU per sequential POST /loans of the loan desk (SQLite, atomic, RECEIPTS=0, as the bench
// runs it) with one of its features toggled at a time, beside its hand-written floor: the CPU the
// server's process used (/proc/PID/stat, all threads, and its main thread alone) over N requests on
// one keep-alive connection after a warm-up, rounds interleaved, median. The client's own CPU is
// not counted, nor is any idle time: what it measures does not move with the machine's load as
// requests per second do. A variant that needs a code change runs a copy of the example with one
// line replaced (`patch`), made under tmp/ of this checkout.
import { cpSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { loanDriver } from './lib/loan-driver.js';
import { LOAN_DESK, startFloor, startLoanDesk } from './lib/loandesk.js';
import { median } from './lib/median.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
const { values } = parseArgs({
  options: {
    requests: { type: 'string', default: '4000' },
    rounds: { type: 'string', default: '5' },
    warmup: { type: 'string', default: '4000' },
    profile: { type: 'string' },
  },
});
const [requests, rounds, warmup] = [values.requests, values.rounds, values.warmup].map(Number);
const TICK_US = 1e6 / 100; // USER_HZ: /proc/PID/stat counts CPU time in 1/100 s on Linux

const ATOMIC = { id: 'sqlite-atomic', db: 'sqlite', mode: 'atomic' };
const BENCH_ENV = { RECEIPTS: '0' };
const APP = 'examples/library-loans/app.js';
const SQLITE = 'examples/library-loans/databases/sqlite.js';

/** Each row: the desk (or floor), its env, the requests it is sent, and an optional code patch. */
const ROWS = [
  { id: 'desk keyed (bench: RECEIPTS=0)', kind: 'fresh' },
  { id: 'desk keyless', kind: 'keyless' },
  { id: 'floor keyed', floor: 'sqlite', kind: 'fresh' },
  { id: 'floor keyless', floor: 'sqlite', kind: 'keyless' },
  { id: 'desk keyed, LOG_LEVEL=silent', kind: 'fresh', env: { LOG_LEVEL: 'silent' } },
  { id: 'desk keyed, COMPLETER=0', kind: 'fresh', env: { COMPLETER: '0' } },
  {
    id: 'desk keyed, encryption on',
    kind: 'fresh',
    env: { IDEMPOTENCY_ENCRYPTION_KEY: Buffer.alloc(32, 7).toString('base64') },
  },
  {
    id: 'desk keyed, no intent',
    kind: 'fresh',
    patch: [APP, 'intent: idem?.downstreamKey(', 'intent: undefined && idem?.downstreamKey('],
  },
  {
    id: 'desk keyed, no receipt_job INSERT',
    kind: 'fresh',
    patch: [SQLITE, 'queueReceipt.run(loan.id);', ''],
  },
  {
    id: 'desk keyed, foreign keys off',
    kind: 'fresh',
    patch: [SQLITE, "db.exec('PRAGMA foreign_keys = ON');", "db.exec('PRAGMA foreign_keys = OFF');"],
  },
  {
    // Measurement only: the WAL then grows without end.
    id: 'desk keyed, no WAL checkpoint',
    kind: 'fresh',
    patch: [
      SQLITE,
      "db.exec('PRAGMA foreign_keys = ON');",
      "db.exec('PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = 0');",
    ],
  },
];

/** A copy of the example with `from` replaced by `to` in `file`; answers its server.js. */
function patchedDesk(name, [file, from, to]) {
  const copy = path.join(root, 'tmp', 'desk-breakdown', name);
  rmSync(copy, { recursive: true, force: true });
  mkdirSync(path.dirname(copy), { recursive: true });
  cpSync(path.join(root, 'examples/library-loans'), copy, { recursive: true });
  // http/json-body.js reads the examples' shared ../../json-object.js.
  cpSync(path.join(root, 'examples/json-object.js'), path.join(copy, '..', 'json-object.js'));
  const target = path.join(copy, path.relative('examples/library-loans', file));
  const text = readFileSync(target, 'utf8');
  if (!text.includes(from)) throw new Error(`${file} no longer holds ${from}`);
  writeFileSync(target, text.replace(from, to));
  return path.join(copy, path.basename(LOAN_DESK));
}

/** CPU µs a process (all threads) and its main thread have used. */
function cpuUs(pid) {
  const read = (file) => {
    const fields = readFileSync(file, 'utf8').split(') ')[1].split(' ');
    return (Number(fields[11]) + Number(fields[12])) * TICK_US; // utime, stime
  };
  return { all: read(`/proc/${pid}/stat`), main: read(`/proc/${pid}/task/${pid}/stat`) };
}

const ctx = { runId: `bd${process.pid}`, tmpDir: path.join(os.tmpdir(), `desk-breakdown-${process.pid}`) };
mkdirSync(ctx.tmpDir, { recursive: true });
const servers = [];
try {
  for (const [i, row] of ROWS.entries()) {
    const execArgv = values.profile
      ? ['--cpu-prof', `--cpu-prof-dir=${values.profile}`, `--cpu-prof-name=row${i}.cpuprofile`]
      : [];
    const server = row.floor
      ? await startFloor(ctx, row.floor, { execArgv })
      : await startLoanDesk(ctx, ATOMIC, {
          tag: `_${i}`,
          env: { ...BENCH_ENV, ...row.env },
          ...(row.patch && { desk: patchedDesk(`row${i}`, row.patch) }),
          execArgv,
        }).catch((error) => Promise.reject(new Error(`${row.id}: ${error.message}`)));
    const driver = loanDriver(server.url, ctx.runId);
    await driver.send(row.kind, warmup);
    servers.push({ row, server, driver, all: [], main: [] });
  }
  for (let round = 0; round < rounds; round++) {
    for (const entry of servers) {
      const before = cpuUs(entry.server.child.pid);
      await entry.driver.send(entry.row.kind, requests);
      const after = cpuUs(entry.server.child.pid);
      entry.all.push((after.all - before.all) / requests);
      entry.main.push((after.main - before.main) / requests);
    }
  }
  console.log('| row | CPU µs/request, process | main thread | rounds (process) |');
  console.log('|---|---:|---:|---|');
  for (const { row, all, main } of servers) {
    console.log(
      `| ${row.id} | ${median(all).toFixed(1)} | ${median(main).toFixed(1)} | ${all.map((v) => v.toFixed(0)).join(' ')} |`,
    );
  }
} finally {
  for (const { server, driver } of servers) {
    driver.close();
    await server.stop();
  }
  rmSync(ctx.tmpDir, { recursive: true, force: true });
}
