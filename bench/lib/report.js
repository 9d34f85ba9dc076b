import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';

const cell = (value) => (value === null || value === undefined ? '—' : String(value).replaceAll('|', '\\|'));

function table({ columns, rows }) {
  const lines = [`| ${columns.join(' | ')} |`, `|${columns.map(() => '---').join('|')}|`];
  for (const row of rows) lines.push(`| ${row.map(cell).join(' | ')} |`);
  return lines.join('\n');
}

const thousands = (n) => `${Math.round(n / 1000)}k`;

/**
 * What a target carries beside its figure: its own detail, and for a missed desk ÷ floor target
 * (`counted: { desk, floor }`) the instructions scenario's counts of that desk's fresh key against
 * that floor's, when the run counted both.
 */
function besides(target, results) {
  const parts = target.detail ? [target.detail] : [];
  const counts = results.scenarios.instructions?.raw;
  if (target.met === false && target.counted && counts) {
    const desk = counts[target.counted.desk];
    const floor = counts[`floor-${target.counted.floor}`];
    const [ours, theirs] = [desk?.instructions?.fresh, floor?.instructions?.fresh];
    if (Number.isFinite(ours) && Number.isFinite(theirs)) {
      parts.push(`fresh key: ${thousands(ours)} vs the floor's ${thousands(theirs)} instructions`);
    }
    const [turns, floorTurns] = [desk?.turns?.fresh, floor?.turns?.fresh];
    if (turns && floorTurns) {
      parts.push(
        `${turns.promises.toFixed(1)} vs ${floorTurns.promises.toFixed(1)} promises, ${turns.reactions.toFixed(1)} vs ${floorTurns.reactions.toFixed(1)} reaction jobs a request`,
      );
    }
  }
  return parts.join('; ') || null;
}

export function markdown(results) {
  const out = [
    `## Benchmarks — ${results.date}`,
    '',
    `Machine: ${results.machine.cpus} × ${results.machine.cpuModel}, ${results.machine.memoryGiB} GiB, Node ${results.machine.node}, ${results.machine.platform}. ` +
      `Command: \`${results.command}\`. ${results.settings.rounds} round(s) of ${results.settings.durationS} s per contender, ` +
      `${results.settings.connections} connections, medians shown; server in its own process, autocannon in another. Total ${Math.round(results.totalSeconds)} s. ` +
      `Method and scenarios: \`bench/README.md\`; every number: \`bench/results/${results.date}.json\`. The machine is shared, so single rounds vary (the peers table lists them)` +
      (results.machine.loadAverageAtStart
        ? `; load average ${results.machine.loadAverageAtStart[0]} at start, ${results.machine.loadAverageAtEnd?.[0]} at end.`
        : '.'),
    '',
  ];
  const targets = Object.values(results.scenarios).flatMap((s) => s.targets ?? []);
  if (targets.length > 0) {
    out.push('### Targets', '');
    out.push(
      table({
        columns: ['figure', 'measured', 'target', 'met', 'beside it (ours vs the floor’s)'],
        rows: targets.map((t) =>
          t.op === null
            ? [t.name, t.value, 'informational', '—', besides(t, results)]
            : [t.name, t.value, `${t.op} ${t.target}`, t.met ? 'yes' : '**no**', besides(t, results)],
        ),
      }),
      '',
    );
  }
  for (const scenario of Object.values(results.scenarios)) {
    out.push(`### ${scenario.title}`, '');
    if (scenario.error) out.push(`Failed: \`${scenario.error}\``, '');
    if (scenario.table?.rows.length) out.push(table(scenario.table), '');
    for (const extra of scenario.tables ?? []) {
      if (extra.caption) out.push(extra.caption, '');
      if (extra.rows.length) out.push(table(extra), '');
    }
    for (const note of scenario.notes ?? []) out.push(`- ${note}`);
    if (scenario.notes?.length) out.push('');
  }
  return `${out.join('\n').trimEnd()}\n`;
}

/**
 * A complete full run writes `<date>.json`, `<date>.md` and `latest.md` (docs/benchmarks.md embeds it). A
 * quick or partial run writes under `local/` (not committed), so it never replaces those.
 */
export async function writeResults(results, dir) {
  const { quick, only, contenders } = results.settings;
  const complete = !quick && !only && !contenders;
  const target = complete ? dir : path.join(dir, 'local');
  await mkdir(target, { recursive: true });
  const md = markdown(results);
  const suffix = `${quick ? '-quick' : ''}${only ? `-${only.join('-')}` : ''}${contenders ? '-some' : ''}`;
  const base = path.join(target, `${results.date}${suffix}`);
  await writeFile(`${base}.json`, `${JSON.stringify(results, null, 2)}\n`);
  await writeFile(`${base}.md`, md);
  await writeFile(path.join(target, 'latest.md'), md);
  return { json: `${base}.json`, md: `${base}.md` };
}

const START = '<!-- benchmarks -->';
const END = '<!-- /benchmarks -->';

/**
 * Puts `md` between the `<!-- benchmarks -->` and `<!-- /benchmarks -->` markers of a Markdown
 * page (the end marker is added after the start one when missing). Touches nothing else; no marker, no change.
 */
export async function embedInPage(md, pagePath) {
  const page = await readFile(pagePath, 'utf8').catch(() => undefined);
  const start = page?.indexOf(START) ?? -1;
  if (start < 0) return false;
  const end = page.indexOf(END, start);
  const after =
    end < 0 ? `\n${page.slice(start + START.length).replace(/^\r?\n/, '')}` : page.slice(end + END.length);
  await writeFile(pagePath, `${page.slice(0, start)}${START}\n${md}${END}${after}`);
  return true;
}
