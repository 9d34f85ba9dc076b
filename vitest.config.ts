import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Fault tests restart shared services; vitest.faults.config.ts runs them alone, after this run.
    exclude: ['**/node_modules/**', 'test/faults/**'],
    // Builds dist/ when stale: examples and child processes import `retrysafe/*` from there.
    globalSetup: ['test/support/build.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Several suites start real servers, child processes and databases; two cores.
    fileParallelism: true,
    maxWorkers: 2,
  },
});
