import { defineConfig } from 'vitest/config';

/**
 * Fault tests restart the shared PostgreSQL cluster (or other shared services), which would break
 * any test running beside them: they run after the main suite, one file at a time.
 */
export default defineConfig({
  test: {
    include: ['test/faults/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    fileParallelism: false,
  },
});
