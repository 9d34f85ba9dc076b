import { execFileSync } from 'node:child_process';
import { copyFile, cp, mkdir, readFile, symlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { load } from '../lib/load.js';
import { LOAN, startLoanDesk, VARIANTS } from '../lib/loandesk.js';
import { measureSet, round2, target } from '../lib/measure.js';
import { median } from '../lib/median.js';
import { startAll, startServer, stopAll } from '../lib/proc.js';
import { instructionsPerRequest } from './instructions.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');
const PATCHES = path.resolve(here, '../tricks');
const TRICK_PATH = path.resolve(here, '../servers/trick-path.js');

/** Issue 33, item 6: a runtime trick whose win is under 3 % of its path goes. */
const MIN_WIN_PERCENT = 3;
/**
 * A timed win under this is close enough to the line, on a shared machine, for the tiebreak:
 * callgrind's instructions per request of the path with and without the trick, which load does
 * not move.
 */
const COUNT_BELOW_PERCENT = 2 * MIN_WIN_PERCENT;

const NODE_MAJOR = Number(process.versions.node.split('.')[0]);

/**
 * The speed tricks of docs/decisions.md ("Runtime internals we lean on"), each with the patch
 * (bench/tricks/<name>.patch) that takes it out of src/ and the path it sits on. A trick that
 * does nothing on this Node says why in `offWhy` and is not measured (a run on Node 22 measures
 * it). The table's other rows are behaviour, not speed, and are not measured: holding `res` by
 * replacing its methods (the only way to hold a node:http answer until it is saved),
 * closeAfterDrain (a 413 instead of a reset), no NOTIFY on an atomic PostgreSQL completion and the
 * division by zero that fences it (round trips and a database-wide lock: the structure of the
 * store, counted by the instructions scenario).
 */
const TRICKS = [
  {
    name: 'dictionary-mode',
    trick: 'toDictionaryMode on Express req/res',
    path: 'express',
    offWhy:
      NODE_MAJOR >= 24 &&
      'retrysafe does it only on Node < 24: on Node 24 it cost the path a third (2026-12-04)',
  },
  {
    name: 'als-close-frame',
    trick: 'AsyncLocalStorage disabled with no transaction open',
    path: 'desk-sqlite',
    offWhy:
      NODE_MAJOR >= 24 &&
      'on Node 24 AsyncLocalStorage runs on AsyncContextFrame, with no async hooks to switch off',
  },
  {
    name: 'redis-cork',
    trick: 'Redis socket corked for one turn (writesPerTurn)',
    path: 'desk-redis',
    offWhy: false,
  },
];
const MEASURED = TRICKS.filter((t) => !t.offWhy);

const PATHS = {
  express: 'fresh-key POST, Express 5 + retrysafe/express, no-op store (in process)',
  'desk-sqlite': 'loan desk, SQLite atomic, fresh-key POST /loans (HTTP)',
  'desk-redis': 'loan desk, Redis store (lease), receipts off, fresh-key POST /loans (HTTP)',
};
/**
 * The desk's environment on a path. With the Redis store the desk sends receipts through a BullMQ
 * worker in its own process, whose Redis traffic swung the path's count from 1.5M to 3.8M
 * instructions a request between runs and the cork's win from +52 % to -27 %: off, the path is
 * the store's.
 */
const DESK_ENV = { 'desk-sqlite': {}, 'desk-redis': { RECEIPTS: '0' } };
const DESK_OF = {
  'desk-sqlite': VARIANTS.find((v) => v.id === 'sqlite-atomic'),
  'desk-redis': VARIANTS.find((v) => v.id === 'redis'),
};

/** How this repository's build compiles one source file (dist/ is `tsc -p tsconfig.build.json`). */
const transpile = (source, fileName) =>
  ts.transpileModule(source, {
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.ESNext,
      verbatimModuleSyntax: true,
    },
    fileName,
  }).outputText;

/**
 * A copy of the package with one trick taken out: dist/ as built, src/ with the trick's patch
 * applied (`git apply`: a patch that no longer applies fails the scenario), and each patched file
 * compiled into dist/ again. Each file is first compiled unpatched and must come out as the build
 * wrote it, so the variant differs from the build by the patch alone. The loan desk is copied
 * too, so that its `retrysafe` imports resolve to this copy's dist/.
 */
async function buildVariant(trick, dir) {
  const root = path.join(dir, trick.name);
  await mkdir(path.join(root, 'examples'), { recursive: true });
  await cp(path.join(repo, 'dist'), path.join(root, 'dist'), { recursive: true });
  await cp(path.join(repo, 'src'), path.join(root, 'src'), { recursive: true });
  await cp(path.join(repo, 'examples/library-loans'), path.join(root, 'examples/library-loans'), {
    recursive: true,
  });
  await copyFile(path.join(repo, 'examples/json-object.js'), path.join(root, 'examples/json-object.js'));
  await copyFile(path.join(repo, 'package.json'), path.join(root, 'package.json'));
  await symlink(path.join(repo, 'node_modules'), path.join(root, 'node_modules'), 'dir');
  const patch = path.join(PATCHES, `${trick.name}.patch`);
  const git = (args) => execFileSync('git', args, { cwd: root, encoding: 'utf8', stdio: 'pipe' });
  try {
    git(['apply', '--check', patch]);
  } catch (error) {
    throw new Error(`bench/tricks/${trick.name}.patch no longer applies to src/: ${error.stderr}`);
  }
  const files = git(['apply', '--numstat', patch])
    .trim()
    .split('\n')
    .map((line) => line.split('\t')[2]);
  git(['apply', patch]);
  for (const file of files) {
    if (!/^src\/.*\.ts$/.test(file)) throw new Error(`${trick.name}.patch touches ${file}, not src/*.ts`);
    const built = path.join('dist', file.slice('src/'.length).replace(/\.ts$/, '.js'));
    const asBuilt = (await readFile(path.join(repo, built), 'utf8')).replace(
      /\/\/# sourceMappingURL=.*\n?$/,
      '',
    );
    if (transpile(await readFile(path.join(repo, file), 'utf8'), file) !== asBuilt) {
      throw new Error(`${file} compiles unlike dist/: run npm run build first`);
    }
    await writeFile(path.join(root, built), transpile(await readFile(path.join(root, file), 'utf8'), file));
  }
  return root;
}

function hasValgrind() {
  try {
    execFileSync('valgrind', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

const mean = (values) => values.reduce((sum, v) => sum + v, 0) / values.length;

/**
 * The in-process paths: one process per build and path (servers/trick-path.js), the unpatched
 * build's and each variant's taking turns slice by slice, the order rotated each slice. Returns
 * µs of CPU time per request of every slice, by contender id.
 */
async function timeInProcess(ctx, contenders, { slices, perSlice }) {
  const { servers, failed } = await startAll(
    contenders.map(({ id, root, kind }) => ({
      id,
      start: () => startServer(TRICK_PATH, { env: { TRICK_ROOT: root, TRICK_PATH: kind } }),
    })),
  );
  try {
    if (failed.size) throw new Error([...failed].map(([id, m]) => `${id}: ${m}`).join('; '));
    for (const { id } of contenders) await servers.get(id).ask({ cmd: 'time', count: perSlice * 5 });
    const times = Object.fromEntries(contenders.map(({ id }) => [id, []]));
    for (let slice = 0; slice < slices; slice++) {
      for (let i = 0; i < contenders.length; i++) {
        const { id } = contenders[(i + slice) % contenders.length];
        times[id].push(await servers.get(id).ask({ cmd: 'time', count: perSlice }));
      }
      if ((slice + 1) % 10 === 0 || slice + 1 === slices) {
        ctx.log(
          `  slice ${slice + 1}/${slices}: ${contenders.map(({ id }) => `${id} ${round2(mean(times[id].slice(-10)))} µs`).join(', ')}`,
        );
      }
    }
    return times;
  } finally {
    await stopAll(servers);
  }
}

export async function run(ctx) {
  const variants = new Map();
  for (const trick of MEASURED)
    variants.set(trick.name, await buildVariant(trick, path.join(ctx.tmpDir, 'tricks')));
  const raw = {};
  const timed = new Map();
  const report = (trick, unit, withValue, withoutValue, win) =>
    timed.set(trick.name, { unit, withValue, withoutValue, win });

  // In process: µs per request; the win is the share of the path's time without the trick that
  // it saves, median over slices each set against the unpatched build's slice of the same turn.
  for (const kind of ['express']) {
    const tricks = MEASURED.filter((t) => t.path === kind);
    if (!tricks.length) continue;
    const contenders = [
      { id: `${kind}:with`, root: repo, kind },
      ...tricks.map((t) => ({ id: `${kind}:${t.name}`, root: variants.get(t.name), kind })),
    ];
    ctx.log(`  ${kind}: ${contenders.map((c) => c.id).join(', ')}`);
    const times = await timeInProcess(ctx, contenders, {
      slices: ctx.quick ? 6 : 60,
      perSlice: ctx.quick ? 200 : 1000,
    });
    raw[kind] = times;
    const base = times[`${kind}:with`];
    for (const trick of tricks) {
      const without = times[`${kind}:${trick.name}`];
      const win = median(without.map((w, i) => ((w - base[i]) / w) * 100));
      report(trick, 'µs', median(base), median(without), win);
    }
  }

  // Over HTTP, for tricks whose effect spans the whole process (async hooks) or the store's
  // socket: the unpatched desk and the variant's, interleaved rounds of fresh-key POSTs.
  for (const kind of ['desk-sqlite', 'desk-redis']) {
    const tricks = MEASURED.filter((t) => t.path === kind);
    if (!tricks.length) continue;
    const variant = DESK_OF[kind];
    const { servers, failed } = await startAll([
      { id: 'with', start: () => startLoanDesk(ctx, variant, { tag: '-tricks', env: DESK_ENV[kind] }) },
      ...tricks.map((t) => ({
        id: t.name,
        start: () =>
          startLoanDesk(ctx, variant, {
            tag: `-${t.name}`,
            env: DESK_ENV[kind],
            desk: path.join(variants.get(t.name), 'examples/library-loans/server.js'),
          }),
      })),
    ]);
    try {
      if (failed.size) throw new Error([...failed].map(([id, m]) => `${kind} ${id}: ${m}`).join('; '));
      const entries = [...servers].map(([id, server]) => ({
        id,
        run: (durationS) => load({ url: `${server.url}/loans`, body: LOAN, keyed: true, durationS }),
      }));
      const measured = await measureSet(entries, { ...ctx, rounds: ctx.rounds * 2 });
      raw[kind] = measured;
      for (const trick of tricks) {
        const [withRounds, withoutRounds] = [measured.with.rounds, measured[trick.name].rounds];
        // Rounds run in turns: round r of each is set against round r of the other.
        const win = median(withoutRounds.map((w, i) => (1 - w / withRounds[i]) * 100));
        report(trick, 'req/s', measured.with.rps, measured[trick.name].rps, win);
        if (measured.with.non2xx + measured[trick.name].non2xx > 0) {
          throw new Error(
            `${kind}: non-2xx answers (${measured.with.non2xx} / ${measured[trick.name].non2xx})`,
          );
        }
      }
    } finally {
      await stopAll(servers);
    }
  }

  // The tiebreak: instructions per request with and without each trick the timing left close.
  const valgrind = hasValgrind();
  const close = MEASURED.filter((t) => timed.get(t.name).win < COUNT_BELOW_PERCENT);
  const counts = new Map();
  if (!valgrind && close.length) ctx.log('  valgrind is not installed: no instruction counts');
  const countOf = async (id, root, trick) => {
    const inProcess = !DESK_OF[trick.path];
    const start = inProcess
      ? (options) =>
          startServer(TRICK_PATH, { ...options, env: { TRICK_ROOT: root, TRICK_PATH: trick.path } })
      : (options) =>
          startLoanDesk(ctx, DESK_OF[trick.path], {
            tag: `-count-${id.replaceAll(':', '-')}`,
            desk: path.join(root, 'examples/library-loans/server.js'),
            ...options,
            env: { ...DESK_ENV[trick.path], ...options?.env },
          });
    const sizes = inProcess
      ? { warmup: ctx.quick ? 2000 : 20_000, count: ctx.quick ? 200 : 2000 }
      : { warmup: ctx.quick ? 1000 : 6000, count: ctx.quick ? 100 : 500 };
    const kind = inProcess ? trick.path : 'fresh';
    const { perRequest } = await instructionsPerRequest(
      ctx,
      `tricks-${id.replaceAll(':', '-')}`,
      start,
      [kind],
      sizes,
      inProcess
        ? (server) => ({ send: (_, count) => server.ask({ cmd: 'time', count }), close() {} })
        : undefined,
    );
    ctx.log(`  ${id}: ${Math.round(perRequest[kind])} instructions a request`);
    return perRequest[kind];
  };
  for (const trick of valgrind ? close : []) {
    const base = `${trick.path}:with`;
    if (!counts.has(base)) counts.set(base, await countOf(base, repo, trick));
    counts.set(trick.name, await countOf(trick.name, variants.get(trick.name), trick));
  }
  raw.instructions = Object.fromEntries(counts);

  const rows = [];
  const targets = [];
  const k = (n) => `${Math.round(n / 1000)}k`;
  for (const trick of TRICKS) {
    if (trick.offWhy) {
      const off = `not in effect on Node ${process.versions.node}: ${trick.offWhy}`;
      rows.push([
        trick.trick,
        `\`bench/tricks/${trick.name}.patch\``,
        PATHS[trick.path],
        off,
        '—',
        '—',
        '—',
        '—',
        '—',
      ]);
      continue;
    }
    const { unit, withValue, withoutValue, win } = timed.get(trick.name);
    const [countWith, countWithout] = [counts.get(`${trick.path}:with`), counts.get(trick.name)];
    const counted = countWithout !== undefined;
    const countWin = counted ? ((countWithout - countWith) / countWithout) * 100 : Number.NaN;
    // A close timing is settled by the count; with no count, by the timing alone.
    const keep = counted ? countWin >= MIN_WIN_PERCENT : win >= MIN_WIN_PERCENT;
    rows.push([
      trick.trick,
      `\`bench/tricks/${trick.name}.patch\``,
      PATHS[trick.path],
      `${round2(withValue)} ${unit}`,
      `${round2(withoutValue)} ${unit}`,
      round2(win),
      counted ? `${k(countWith)} / ${k(countWithout)}` : '—',
      counted ? round2(countWin) : '—',
      keep ? 'keep' : `**under ${MIN_WIN_PERCENT} %**`,
    ]);
    targets.push({
      ...target(`tricks: ${trick.name}, win % of its path (${trick.path})`, win, '>=', MIN_WIN_PERCENT),
      met: keep,
      detail: counted
        ? `instructions a request ${k(countWith)} with, ${k(countWithout)} without: ${round2(countWin)} %`
        : null,
    });
  }

  return {
    title: `Runtime tricks (docs/decisions.md): each path with and without each trick, in one interleaved run`,
    table: {
      columns: [
        'trick',
        'taken out by',
        'path',
        'with',
        'without',
        'win %',
        'instructions with / without',
        'instructions win %',
        `≥ ${MIN_WIN_PERCENT} %`,
      ],
      rows,
    },
    notes: [
      `Each trick is taken out of a copy of the build by its patch (bench/tricks/<name>.patch applied to src/ with git apply, the patched files compiled into a copy of dist/); nothing in the library knows about the bench. A patch that no longer applies fails the scenario.`,
      `In-process paths (servers/trick-path.js): one process per build, the unpatched build's and each variant's taking turns every ${ctx.quick ? 200 : 1000} requests; µs of each process's CPU time per request, medians over ${ctx.quick ? 6 : 60} slices; win % = (without − with) ÷ without, median over the slices of one turn. HTTP paths: the unpatched loan desk and the variant's, ${ctx.rounds * 2} interleaved rounds of ${ctx.durationS} s, 10 connections; win % = 1 − without ÷ with req/s, median over rounds.`,
      `Tiebreak, for each trick whose timed win is under ${COUNT_BELOW_PERCENT} %: instructions per request of the path in the server's main thread (valgrind callgrind, as the instructions scenario counts them), with and without the trick, after the same uninstrumented warm-up. Where counted, the instructions win decides whether the trick stays (≥ ${MIN_WIN_PERCENT} %); elsewhere the timed win does.`,
      'Not measured, because they are behaviour or structure rather than speed: replacing writeHead/write/end while a handler runs (the only way to hold an answer until it is saved), closeAfterDrain (a 413 instead of a reset), no NOTIFY on an atomic PostgreSQL completion and the division by zero that fences it (a database-wide lock and a round trip, not a V8 effect).',
    ],
    targets,
    raw,
  };
}
