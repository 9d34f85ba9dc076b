// npm run bench [-- --quick] [-- --only <scenario>[,<scenario>]] [-- --contenders <id>[,<id>]] [-- --profile]
// Drives real servers on loopback with autocannon and writes bench/results/<date>.{json,md}.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const here = path.dirname(fileURLToPath(import.meta.url));
const SCENARIOS = [
  'engine',
  'overhead',
  'replay',
  'hotkey',
  'growth',
  'peers',
  'memory',
  'fines',
  'sqlite-drivers',
  'jobs',
  'orm',
  'tricks',
  'instructions',
];

const { values: flags } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    only: { type: 'string' },
    contenders: { type: 'string' },
    profile: { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h', default: false },
  },
});
if (flags.help) {
  console.log(`usage: npm run bench -- [--quick] [--only ${SCENARIOS.join(',')}] [--profile]
  --quick    one short round per contender and small store sizes (about 70 s on 2 cores)
  --only     run only the named scenarios (comma-separated)
  --contenders  instructions: count only these servers (sqlite-atomic, floor-cheapest, …), and only
             the paths named after a colon (sqlite-atomic:fresh:replay): one count in a minute
  --profile  start retrysafe servers with --cpu-prof (profiles in bench/profiles/)`);
  process.exit(0);
}
const selected = flags.only ? flags.only.split(',').map((s) => s.trim()) : SCENARIOS;
for (const name of selected) {
  if (!SCENARIOS.includes(name))
    throw new Error(`--only: unknown scenario "${name}" (${SCENARIOS.join(', ')})`);
}

// Peers are dev-dependencies of bench/ only; the package's own install never sees them.
if (!existsSync(path.join(here, 'node_modules'))) {
  console.log('installing bench dependencies (npm --prefix bench ci)…');
  execFileSync('npm', ['--prefix', here, 'ci', '--no-audit', '--no-fund'], { stdio: 'inherit' });
}

const { setRunId, CONNECTIONS } = await import('./lib/load.js');
const { embedInPage, markdown, writeResults } = await import('./lib/report.js');
const { cleanup } = await import('./lib/services.js');

const started = performance.now();
const runId = `rsbench_${process.pid}_${Date.now().toString(36)}`;
setRunId(runId);
const tmpDir = await mkdtemp(path.join(os.tmpdir(), 'rsbench-'));
const ctx = {
  quick: flags.quick,
  rounds: flags.quick ? 1 : 5,
  durationS: flags.quick ? 0.5 : 2,
  warmupS: flags.quick ? 0.25 : 1,
  runId,
  tmpDir,
  profileDir: flags.profile ? path.join(here, 'profiles') : undefined,
  contenders: flags.contenders?.split(',').map((s) => s.trim()),
  log: (line) => console.log(line),
};

const results = {
  date: new Date().toISOString().slice(0, 10),
  startedAt: new Date().toISOString(),
  command: `npm run bench${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`,
  machine: {
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model.trim() ?? 'unknown',
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    node: process.version,
    platform: `${os.type()} ${os.release()}`,
    loadAverageAtStart: os.loadavg().map((n) => Number(n.toFixed(2))),
  },
  settings: {
    quick: flags.quick,
    rounds: ctx.rounds,
    durationS: ctx.durationS,
    warmupS: ctx.warmupS,
    connections: CONNECTIONS,
    only: flags.only ? selected : undefined,
    contenders: ctx.contenders,
  },
  scenarios: {},
};

let interrupted = false;
process.on('SIGINT', () => {
  interrupted = true;
});

try {
  for (const name of selected) {
    if (interrupted) break;
    const scenarioStarted = performance.now();
    console.log(`\n== ${name}`);
    const { run } = await import(`./scenarios/${name}.js`);
    try {
      results.scenarios[name] = await run(ctx);
    } catch (error) {
      console.error(error);
      results.scenarios[name] = { title: name, error: String(error?.message ?? error), targets: [] };
    }
    results.scenarios[name].seconds = Math.round((performance.now() - scenarioStarted) / 1000);
    console.log(`== ${name} done in ${results.scenarios[name].seconds} s`);
  }
} finally {
  await cleanup(runId).catch((error) => console.error(`cleanup failed: ${error.message}`));
  await rm(tmpDir, { recursive: true, force: true });
}

results.totalSeconds = (performance.now() - started) / 1000;
results.machine.loadAverageAtEnd = os.loadavg().map((n) => Number(n.toFixed(2)));
const written = await writeResults(results, path.join(here, 'results'));
console.log(`\nwrote ${written.json} and ${written.md} in ${Math.round(results.totalSeconds)} s`);
if (
  !flags.quick &&
  !flags.only &&
  !flags.contenders &&
  (await embedInPage(markdown(results), path.join(here, '..', 'docs', 'benchmarks.md')))
) {
  console.log('updated the benchmarks section of docs/benchmarks.md');
}
for (const t of Object.values(results.scenarios).flatMap((s) => s.targets ?? [])) {
  if (t.op === null) console.log(`info   ${t.name}: ${t.value}`);
  else console.log(`${t.met ? 'met   ' : 'MISSED'} ${t.name}: ${t.value} (target ${t.op} ${t.target})`);
}
