// node bench/count-engine.js [--root DIR] [--mixed] [--requests N] [--rounds N] [--warmup N] [--keep DIR]
// CPU instructions (valgrind callgrind) and promise turns (PromiseHook) per request of the engine
// scenario's exchange (lib/engine-exchange.js): counts, not times, so two builds compare on a
// loaded machine. --root points at another checkout's build (an older commit's worktree after
// `npm run build`) to count its dist/ instead of this one's.
import { execFile, fork } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, writeFileSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs, promisify } from 'node:util';
import { promiseHooks } from 'node:v8';
import { contenders, exchange, SLICE } from './lib/engine-exchange.js';
import { median } from './lib/median.js';

const execFile$ = promisify(execFile);
const script = fileURLToPath(import.meta.url);
const here = path.dirname(script);

/**
 * The processes counted, each with the contenders it serves. Apart, bare and keyed each get a
 * process of their own, as a server serves one kind of request: V8 optimizes node:http's code
 * for that handler's objects alone. Mixed, one process serves the engine scenario's four
 * contenders in turns of SLICE requests, as the scenario does: node:http's code then sees the
 * adapter's response objects beside bare ones, and is optimized for both.
 */
const LAYOUTS = { apart: [['bare'], ['keyed']], mixed: [['bare', 'keyed', 'events', 'otel']] };

/**
 * The child's side: serves its contenders `warmup` requests each, in turns of SLICE; under
 * callgrind, then waits for the parent to switch instrumentation on, through files in
 * `handshake` rather than IPC (receiving a message deoptimizes EventEmitter and stream code the
 * requests run, which V8 would recompile inside the windows). Then `settle` more requests each,
 * and `rounds` rounds of `count` each, in which every slice is a window opened and closed by
 * `os.loadavg()`: callgrind dumps its counts whenever that function is entered
 * (`--dump-before=uv_loadavg`), so nothing else lands in a window. Sends which contender served
 * each window, and the promises and reaction jobs each contender's windows cost if `turns`.
 */
async function child({ root, serves, warmup, settle, count, rounds, turns, handshake }) {
  const build = (entry) => import(pathToFileURL(path.join(root, 'dist', entry)).href);
  const handlers = contenders({
    ...(await build('adapters/node.js')),
    ...(await build('otel/index.js')),
  });
  const names = serves.split(',');
  let seq = 0;
  let serving = names[0];
  const totals = Object.fromEntries(names.map((name) => [name, { promises: 0, reactions: 0 }]));
  const windows = [];
  const inTurns = async (perContender, round) => {
    for (let slice = 0; slice < perContender / SLICE; slice++) {
      for (let i = 0; i < names.length; i++) {
        serving = names[(i + slice) % names.length];
        if (round !== undefined) {
          os.loadavg();
          windows.push({ name: serving, round });
        }
        for (let n = 0; n < SLICE; n++) await exchange(handlers[serving], `${serving}-${seq++}`);
      }
    }
  };
  await inTurns(warmup);
  if (handshake) {
    writeFileSync(path.join(handshake, 'ready'), '');
    const pause = new Int32Array(new SharedArrayBuffer(4));
    while (!existsSync(path.join(handshake, 'go'))) Atomics.wait(pause, 0, 0, 20);
  }
  await inTurns(settle);
  const stop = turns
    ? promiseHooks.createHook({
        init() {
          totals[serving].promises++;
        },
        before() {
          totals[serving].reactions++;
        },
      })
    : () => {};
  for (let round = 0; round < rounds; round++) await inTurns(count, round);
  os.loadavg();
  stop();
  process.send({ windows, totals }, () => process.exit(0));
}

/** Runs a child to its end; resolves with what it sent. `whenReady(pid)` runs once it waits. */
async function runChild(args, options, handshake, whenReady) {
  const proc = fork(script, ['--child', ...args], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    ...options,
  });
  let sent;
  proc.on('message', (message) => {
    sent = message;
  });
  const exited = once(proc, 'exit');
  try {
    if (handshake) {
      while (!existsSync(path.join(handshake, 'ready')) && proc.exitCode === null) {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await whenReady(proc.pid);
      writeFileSync(path.join(handshake, 'go'), '');
    }
    const [code] = await exited;
    if (code !== 0 || !sent) throw new Error(`count-engine child exited with ${code}`);
    return { pid: proc.pid, sent };
  } finally {
    if (proc.exitCode === null) proc.kill();
  }
}

/** The `summary:` (instructions) of each numbered dump `<prefix>N`, in order of N. */
async function dumpTotals(dir, prefix) {
  const numbered = (await readdir(dir))
    .filter((f) => f.startsWith(prefix))
    .sort((a, b) => Number(a.slice(prefix.length)) - Number(b.slice(prefix.length)));
  return Promise.all(
    numbered.map(async (file) => {
      const match = /^summary: (\d+)/m.exec(await readFile(path.join(dir, file), 'utf8'));
      if (!match) throw new Error(`${file}: no summary line`);
      return Number(match[1]);
    }),
  );
}

/**
 * Per request of each contender: instructions (callgrind, every thread), promises created and
 * reaction jobs run, over `rounds` rounds of `requests` requests after `warmup` requests run
 * uninstrumented (so they cost little time) and SLICE instrumented ones, each per contender.
 * Node runs with `--predictable`: V8 compiles and collects garbage on the main thread, on a
 * schedule that depends on the work alone (no timers, no memory reducer), so the same build counts
 * the same instructions run after run. The instruction figure is the median round's: a round may
 * hold a late compilation of this script's own loop (tens of millions of instructions once), and
 * a round of 1,000 requests spans several young-generation collections, so its share of them is
 * steady. `keep` names a directory for the dumps (for callgrind_annotate); otherwise they go to a
 * temporary one, removed at the end.
 */
export async function countEngine({
  root = path.resolve(here, '..'),
  layout = 'apart',
  requests = 1000,
  rounds = 3,
  warmup = 20000,
  keep,
} = {}) {
  const result = {};
  const dir = keep ?? (await mkdtemp(path.join(os.tmpdir(), 'count-engine-')));
  try {
    for (const serves of LAYOUTS[layout]) {
      const args = [
        ...['--root', root, '--serves', serves.join(','), '--warmup', String(warmup)],
        ...['--settle', String(SLICE), '--requests', String(requests), '--rounds', String(rounds)],
      ];
      const { sent: turns } = await runChild([...args, '--turns'], {});
      const handshake = await mkdtemp(path.join(dir, 'handshake-'));
      const prefix = `callgrind.${serves.join('-')}.`;
      const { pid, sent } = await runChild(
        [...args, '--handshake', handshake],
        {
          execPath: 'valgrind',
          execArgv: [
            '-q',
            '--tool=callgrind',
            '--instr-atstart=no',
            '--dump-before=uv_loadavg',
            `--callgrind-out-file=${path.join(dir, `${prefix}%p`)}`,
            process.execPath,
            '--predictable',
          ],
        },
        handshake,
        (pid) => execFile$('callgrind_control', ['--instr=on', String(pid)]),
      );
      // Dump 1 holds the settling requests, dump N + 1 window N.
      const totals = (await dumpTotals(dir, `${prefix}${pid}.`)).slice(1);
      if (totals.length !== sent.windows.length) {
        throw new Error(`${serves}: ${totals.length} windows dumped, ${sent.windows.length} served`);
      }
      const served = requests * rounds;
      for (const name of serves) {
        const perRound = Array.from({ length: rounds }, (_, round) =>
          sent.windows.reduce((sum, w, i) => sum + (w.name === name && w.round === round ? totals[i] : 0), 0),
        );
        result[name] = {
          instructions: Math.round(median(perRound) / requests),
          rounds: perRound.map((total) => Math.round(total / requests)),
          promises: turns.totals[name].promises / served,
          reactions: turns.totals[name].reactions / served,
        };
      }
    }
  } finally {
    if (!keep) await rm(dir, { recursive: true, force: true });
  }
  result.added = {
    instructions: result.keyed.instructions - result.bare.instructions,
    promises: result.keyed.promises - result.bare.promises,
    reactions: result.keyed.reactions - result.bare.reactions,
  };
  return result;
}

const { values: flags } = parseArgs({
  options: {
    child: { type: 'boolean', default: false },
    serves: { type: 'string' },
    turns: { type: 'boolean', default: false },
    handshake: { type: 'string' },
    root: { type: 'string' },
    mixed: { type: 'boolean', default: false },
    requests: { type: 'string', default: '1000' },
    rounds: { type: 'string', default: '3' },
    warmup: { type: 'string', default: '20000' },
    settle: { type: 'string' },
    keep: { type: 'string' },
  },
});
if (flags.child) {
  await child({
    ...flags,
    warmup: Number(flags.warmup),
    settle: Number(flags.settle),
    count: Number(flags.requests),
    rounds: Number(flags.rounds),
  });
} else if (process.argv[1] === script) {
  const counts = await countEngine({
    root: flags.root && path.resolve(flags.root),
    layout: flags.mixed ? 'mixed' : 'apart',
    requests: Number(flags.requests),
    rounds: Number(flags.rounds),
    warmup: Number(flags.warmup),
    keep: flags.keep && path.resolve(flags.keep),
  });
  console.log(JSON.stringify(counts));
}
