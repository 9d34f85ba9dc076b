import { join } from 'node:path';
import { defineConfig } from 'vitest/config';
import { mutationProbes, probeBases } from '../../src/testing/probes.js';

/**
 * The store conformance suite against every mutation probe and, as the control, the unbroken
 * stores they wrap: one project per subject over the same file, run by test/testing.probes.test.ts.
 */
export const PROBE_SUBJECTS = [
  ...Object.keys(probeBases).map((base) => `unbroken ${base}`),
  ...mutationProbes.map((probe) => probe.name),
];

export default defineConfig({
  root: join(import.meta.dirname, '../..'),
  test: {
    // The suite mostly sleeps out leases, so every subject runs at once, even on two cores.
    maxWorkers: PROBE_SUBJECTS.length,
    testTimeout: 30_000,
    hookTimeout: 30_000,
    projects: PROBE_SUBJECTS.map((name) => ({
      test: {
        name,
        include: ['test/probes/probe.fixture.ts'],
        env: { RETRYSAFE_PROBE: name },
        testTimeout: 30_000,
        hookTimeout: 30_000,
      },
    })),
  },
});
