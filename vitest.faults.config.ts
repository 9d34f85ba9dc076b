import { defineConfig } from 'vitest/config';

/**
 * Fault tests restart the shared PostgreSQL cluster (or other shared services), which would break
 * any test running beside them: they run after the main suite, one file at a time.
 */
export default defineConfig({
  test: {
    include: ['test/faults/**/*.test.ts'],
    // Builds dist/ when stale: the loan desk runs as a child process importing `retrysafe/*` from there.
    globalSetup: ['test/support/build.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    fileParallelism: false,
  },
});
