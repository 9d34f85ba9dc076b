import { execFile } from 'node:child_process';
import { readdir, readFile, rm } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { loanDriver } from '../lib/loan-driver.js';
import { startFloor, startLoanDesk, VARIANTS } from '../lib/loandesk.js';
import { informational, round2 } from '../lib/measure.js';

/**
 * CPU instructions and promise turns per request, for the loan desk and its hand-written floors
 * on the same requests: counts, not times, so they do not move with the load of a shared machine.
 * Instructions are counted by valgrind's callgrind in the server process's main thread, where
 * requests run (the database or Redis server's own work is not counted), between a zeroing and a
 * dump taken around N sequential requests on one keep-alive connection after a warm-up. V8's
 * helper threads (TurboFan compiling, concurrent GC) are left out of that figure: their share
 * moved by a third between two runs of the same code, with the timing of compilation; the main
 * thread's count repeated within 0.1 %. The raw results keep every thread's total too. Promise
 * turns come from a second run of each server, not under valgrind, with `lib/turn-counter.js`
 * preloaded.
 */
const execFile$ = promisify(execFile);
// valgrind names the pipes callgrind_control talks through after $USER and $HOST, and every bench
// server is started with HOST=127.0.0.1: callgrind_control must be given the same.
const callgrindControl = (command, pid) =>
  execFile$('callgrind_control', [command, String(pid)], { env: { ...process.env, HOST: '127.0.0.1' } });
const TURN_COUNTER = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../lib/turn-counter.js');

/** The desk variants measured, each with the floor its keyed path is compared with. */
const PAIRS = [
  { variant: 'sqlite-atomic', floor: 'sqlite' },
  { variant: 'sqlite-lease', floor: 'sqlite' },
  { variant: 'memory', floor: null },
  { variant: 'postgres-atomic', floor: 'postgres-3rt' },
  { variant: 'postgres-lease', floor: 'postgres-3rt' },
  { variant: 'redis', floor: 'redis' },
];
const FLOORS = ['sqlite', 'postgres', 'postgres-3rt', 'redis', 'cheapest'];
const PATHS = ['fresh', 'replay', 'keyless'];

/**
 * Instructions (callgrind) per request of each path, for one server started by `start`;
 * `driverOf(server)` sends it `n` requests of a path (by default the loan desk's driver).
 */
export async function instructionsPerRequest(
  ctx,
  id,
  start,
  paths,
  { warmup, count },
  driverOf = (server) => loanDriver(server.url, ctx.runId),
) {
  const dir = path.join(ctx.tmpDir, `callgrind-${id}`);
  // Instrumentation starts after the warm-up: uninstrumented, valgrind runs it several times
  // faster, so the warm-up can be long enough for V8 to have compiled the request path (counted
  // after 100 requests, a third of a desk request's instructions were TurboFan compiling it).
  const server = await start({
    execPath: 'valgrind',
    execArgv: [
      '--tool=callgrind',
      '--instr-atstart=no',
      '--separate-threads=yes',
      `--callgrind-out-file=${dir}-%p`,
      process.execPath,
    ],
    startTimeoutMs: 300_000,
  });
  const pid = server.child.pid;
  const load = driverOf(server);
  try {
    const perRequest = {};
    const allThreads = {};
    // Each path is warmed just before it is counted: counted after the other paths' warm-ups, a
    // replay cost two thirds more (V8 deoptimised and recompiled code the last path had shaped).
    for (const kind of paths) {
      await callgrindControl('--instr=off', pid);
      await load.send(kind, warmup);
      await callgrindControl('--instr=on', pid);
      await callgrindControl('--zero', pid);
      await load.send(kind, count);
      await callgrindControl('--dump', pid);
      const totals = await lastDumpTotals(ctx.tmpDir, `callgrind-${id}-${pid}.`);
      perRequest[kind] = totals.main / count;
      allThreads[kind] = totals.all / count;
    }
    return { perRequest, allThreads };
  } finally {
    load.close();
    await server.stop();
    for (const file of await readdir(ctx.tmpDir)) {
      if (file.startsWith(`callgrind-${id}-`)) await rm(path.join(ctx.tmpDir, file), { force: true });
    }
  }
}

/**
 * The `summary:` totals of the newest dump `<prefix>N`, written one file per thread
 * (`<prefix>N-TT`, the main thread's `-01`): the main thread's, and all threads' together.
 */
async function lastDumpTotals(dir, prefix) {
  const dumps = (await readdir(dir)).filter((f) => f.startsWith(prefix));
  const dumpNumber = (file) => Number(file.slice(prefix.length).split('-')[0]);
  const newest = Math.max(...dumps.map(dumpNumber));
  const totals = { main: Number.NaN, all: 0 };
  for (const file of dumps.filter((f) => dumpNumber(f) === newest)) {
    const text = await readFile(path.join(dir, file), 'utf8');
    const match = /^summary: (\d+)/m.exec(text);
    if (!match) throw new Error(`${file}: no summary line`);
    totals.all += Number(match[1]);
    if (file.endsWith('-01')) totals.main = Number(match[1]);
  }
  return totals;
}

/** Promises and reaction jobs per request of each path (the server preloads turn-counter.js). */
async function turnsPerRequest(ctx, start, paths, { warmup, count }) {
  const server = await start({ execArgv: ['--import', TURN_COUNTER] });
  const load = loanDriver(server.url, ctx.runId);
  try {
    for (const kind of paths) await load.send(kind, warmup);
    const perRequest = {};
    for (const kind of paths) {
      const before = await server.ask({ cmd: 'turns' });
      await load.send(kind, count);
      const after = await server.ask({ cmd: 'turns' });
      perRequest[kind] = {
        promises: (after.promises - before.promises) / count,
        reactions: (after.reactions - before.reactions) / count,
      };
    }
    return perRequest;
  } finally {
    load.close();
    await server.stop();
  }
}

/**
 * The contenders `--contenders id[:path…],…` names, each on the paths named after it (all of its
 * own when none is), so one count takes a minute; all of them without the flag.
 */
function chosen(specs, all) {
  if (!specs) return all;
  return specs.map((spec) => {
    const [id, ...paths] = spec.split(':');
    const contender = all.find((c) => c.id === id);
    if (!contender) throw new Error(`--contenders: unknown "${id}" (${all.map((c) => c.id).join(', ')})`);
    return paths.length === 0
      ? contender
      : { ...contender, paths: contender.paths.filter((p) => paths.includes(p)) };
  });
}

export async function run(ctx) {
  // A desk's fresh key counted 476k main-thread instructions after 2,000 warm-up requests and 459k
  // after 6,000, when V8's helper threads had stopped compiling (7k a request left on them).
  const sizes = ctx.quick ? { warmup: 3000, count: 200 } : { warmup: 6000, count: 500 };
  const contenders = chosen(ctx.contenders, [
    ...PAIRS.map(({ variant }) => {
      const v = VARIANTS.find((x) => x.id === variant);
      return {
        id: variant,
        label: `desk: ${v.label}`,
        paths: PATHS,
        start: (options) =>
          startLoanDesk(ctx, v, { tag: `-count-${options.execPath ? 'i' : 't'}`, ...options }),
      };
    }),
    ...FLOORS.map((floor) => ({
      id: `floor-${floor}`,
      label: `floor: ${floor}`,
      paths: floor === 'cheapest' ? ['keyless'] : ['fresh', 'replay'],
      start: (options) => startFloor(ctx, floor, options),
    })),
  ]);
  // Without valgrind the turns are still counted; the instruction columns say why they are empty.
  const valgrind = await execFile$('valgrind', ['--version']).then(
    () => true,
    () => false,
  );
  if (!valgrind) ctx.log('  valgrind is not installed: promise turns only');
  const measured = {};
  for (const c of contenders) {
    try {
      const turns = await turnsPerRequest(ctx, c.start, c.paths, sizes);
      ctx.log(`  ${c.id} turns ${JSON.stringify(turns)}`);
      const { perRequest: instructions, allThreads } = valgrind
        ? await instructionsPerRequest(ctx, c.id, c.start, c.paths, sizes)
        : { perRequest: Object.fromEntries(c.paths.map((kind) => [kind, Number.NaN])) };
      ctx.log(
        `  ${c.id} instructions ${JSON.stringify(instructions)} (all threads ${JSON.stringify(allThreads)})`,
      );
      measured[c.id] = { turns, instructions, allThreadsInstructions: allThreads };
    } catch (error) {
      measured[c.id] = { error: error.message };
      ctx.log(`  ${c.id} unavailable: ${error.message}`);
    }
  }
  const k = (n) => (Number.isFinite(n) ? `${Math.round(n / 1000)}k` : '—');
  const cell = (m, kind) =>
    m?.instructions?.[kind] === undefined
      ? '—'
      : `${k(m.instructions[kind])} / ${round2(m.turns[kind].promises)} / ${round2(m.turns[kind].reactions)}`;
  const rows = contenders.map((c) => {
    const m = measured[c.id];
    if (m.error) return [c.label, `unavailable: ${m.error.slice(0, 160)}`, null, null];
    return [c.label, ...PATHS.map((kind) => cell(m, kind))];
  });
  const targets = [];
  const ratioRows = [];
  // A `--contenders` run may lack a path or a floor: its ratios are left empty.
  const ratio = (a, b) => round2(a / b) ?? '—';
  for (const { variant, floor } of PAIRS) {
    const desk = measured[variant];
    const base = floor && measured[`floor-${floor}`];
    const cheapest = measured['floor-cheapest'];
    if (!desk?.instructions) continue;
    const freshInstr = ratio(desk.instructions.fresh, base?.instructions?.fresh);
    const freshReactions = ratio(desk.turns.fresh?.reactions, base?.turns?.fresh?.reactions);
    ratioRows.push([
      variant,
      floor ?? '—',
      freshInstr,
      freshReactions,
      ratio(desk.instructions.replay, base?.instructions?.replay),
      ratio(desk.instructions.replay, cheapest?.instructions?.keyless),
      k(desk.instructions.fresh - desk.instructions.keyless),
    ]);
    if (freshInstr !== '—') {
      targets.push(
        informational(
          `instructions: ${variant} fresh key, desk ÷ floor (${floor})`,
          desk.instructions.fresh / base.instructions.fresh,
        ),
        informational(
          `microtask turns: ${variant} fresh key, desk ÷ floor (${floor})`,
          desk.turns.fresh.reactions / base.turns.fresh.reactions,
        ),
      );
    }
  }
  return {
    title: 'Instructions and promise turns per request (callgrind; PromiseHook), loan desk and floors',
    table: {
      columns: ['server', ...PATHS.map((kind) => `${kind}: instructions / promises / reactions`)],
      rows,
    },
    tables: [
      {
        caption:
          'Ratios: the desk fresh key ÷ its floor (instructions, reaction jobs), replay ÷ the floor replay, replay ÷ the cheapest POST (instructions), and what a key adds to the desk over its own keyless POST.',
        columns: [
          'desk',
          'floor',
          'fresh instr ÷ floor',
          'fresh reactions ÷ floor',
          'replay instr ÷ floor',
          'replay instr ÷ cheapest POST',
          'keyed − keyless instr',
        ],
        rows: ratioRows,
      },
    ],
    notes: [
      `${sizes.count} sequential requests per path on one keep-alive connection after ${sizes.warmup} of each path; instructions are per request in the server process's main thread (V8's compiler and GC threads, and the database's and Redis's own work, are not in them).`,
      'The desk answers through its own app (catalog checks, loan INSERT, JSON); the floors through the least hand-written code with the same guarantee (bench/servers/floor.js).',
    ],
    targets,
    raw: measured,
  };
}
