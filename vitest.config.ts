import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Several suites start real servers, child processes and databases; two cores.
    fileParallelism: true,
    maxWorkers: 2,
  },
});
