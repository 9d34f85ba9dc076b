import { describe, expect, it } from 'vitest';
import { markdown } from '../bench/lib/report.js';

const results = (instructions?: object) => ({
  date: '2026-12-04',
  command: 'npm run bench',
  totalSeconds: 1,
  machine: { cpus: 2, cpuModel: 'cpu', memoryGiB: 1, node: 'v20', platform: 'linux' },
  settings: { rounds: 1, durationS: 1, connections: 10 },
  scenarios: {
    overhead: {
      title: 'Overhead',
      targets: [
        {
          name: 'desk ÷ floor',
          value: 0.4,
          op: '>=',
          target: 0.8,
          met: false,
          counted: { desk: 'd', floor: 'f' },
        },
        { name: 'met one', value: 0.9, op: '>=', target: 0.8, met: true, counted: { desk: 'd', floor: 'f' } },
        {
          name: 'µs a key ÷ the floor’s',
          value: 3,
          op: '<=',
          target: 1.5,
          met: false,
          detail: '90 µs vs 30 µs',
        },
      ],
    },
    ...(instructions ? { instructions: { title: 'Instructions', targets: [], raw: instructions } } : {}),
  },
});

const targetRows = (md: string) =>
  md
    .split('\n')
    .filter((line) => line.startsWith('| desk') || line.startsWith('| met') || line.startsWith('| µs'));

// Issue 33: a missed target shows the counts that explain it, where the same run has them.
describe('bench report: beside a missed target', () => {
  it('puts the instructions scenario’s counts of that desk and floor beside a missed desk ÷ floor target', () => {
    const counts = {
      d: { instructions: { fresh: 459_000 }, turns: { fresh: { promises: 61, reactions: 33 } } },
      'floor-f': { instructions: { fresh: 238_000 }, turns: { fresh: { promises: 7, reactions: 6 } } },
    };
    expect(targetRows(markdown(results(counts)))).toEqual([
      "| desk ÷ floor | 0.4 | >= 0.8 | **no** | fresh key: 459k vs the floor's 238k instructions; 61.0 vs 7.0 promises, 33.0 vs 6.0 reaction jobs a request |",
      '| met one | 0.9 | >= 0.8 | yes | — |',
      '| µs a key ÷ the floor’s | 3 | <= 1.5 | **no** | 90 µs vs 30 µs |',
    ]);
  });

  it('leaves the column empty when the run counted nothing', () => {
    expect(targetRows(markdown(results()))[0]).toBe('| desk ÷ floor | 0.4 | >= 0.8 | **no** | — |');
  });
});
