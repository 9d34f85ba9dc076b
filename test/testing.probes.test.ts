import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mutationProbes, probeBases } from '../src/testing/probes.js';

/**
 * The store conformance suite has teeth: run (in a vitest of its own, test/probes/vitest.config.ts)
 * against every mutation probe of `retrysafe/testing`, each probe fails at least one of its tests,
 * and the unbroken stores the probes wrap fail none.
 */
const root = join(import.meta.dirname, '..');
const out = mkdtempSync(join(tmpdir(), 'retrysafe-probes-'));

interface AssertionResult {
  ancestorTitles: string[];
  title: string;
  status: string;
}

/** Test titles by status, per subject (the suite's describe names it `store conformance: <subject>`). */
const results = new Map<string, Record<string, string[]>>();

beforeAll(async () => {
  const vitest = join(createRequire(import.meta.url).resolve('vitest/package.json'), '../vitest.mjs');
  const report = join(out, 'report.json');
  const args = [
    'run',
    '--config',
    'test/probes/vitest.config.ts',
    '--reporter=json',
    `--outputFile=${report}`,
  ];
  // Exits 1: the probes' failures are the point. The report says what ran.
  await promisify(execFile)(process.execPath, [vitest, ...args], { cwd: root, timeout: 240_000 }).catch(
    () => undefined,
  );
  const parsed = JSON.parse(readFileSync(report, 'utf8')) as {
    testResults: { assertionResults: AssertionResult[] }[];
  };
  for (const test of parsed.testResults.flatMap((file) => file.assertionResults)) {
    const subject = test.ancestorTitles[0]?.replace(/^store conformance: /, '') ?? '';
    const byStatus = results.get(subject) ?? {};
    byStatus[test.status] = [
      ...(byStatus[test.status] ?? []),
      [...test.ancestorTitles.slice(1), test.title].join(' > '),
    ];
    results.set(subject, byStatus);
  }
}, 300_000);
afterAll(() => rmSync(out, { recursive: true, force: true }));

describe('the store conformance suite against the mutation probes', () => {
  it.each(Object.keys(probeBases))('passes on the unbroken %s store', (base) => {
    const ran = results.get(`unbroken ${base}`);
    expect(ran?.passed?.length).toBeGreaterThan(40);
    expect(ran?.failed ?? []).toEqual([]);
  });

  it.each(mutationProbes.map((probe) => [probe.name, probe] as const))('catches %s', (_name, probe) => {
    const ran = results.get(probe.name);
    expect(ran?.passed?.length, 'the suite ran').toBeGreaterThan(40);
    // Printed so the run says which tests caught it.
    console.info(`${probe.name} (${probe.breaks}) is caught by:\n  ${ran?.failed?.join('\n  ')}`);
    expect(ran?.failed?.length ?? 0).toBeGreaterThan(0);
  });
});
