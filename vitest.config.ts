import { createRequire } from 'node:module';
import { defineConfig } from 'vitest/config';

// One graphql for src/ and the servers under test: Vite would pick graphql's ES build (its
// `module` field) where Node gives Yoga and Apollo the CommonJS one, and Yoga tells a
// GraphQLError by `instanceof`. A user's app gets one copy from Node, as this gives the tests.
const graphql = createRequire(import.meta.url).resolve('graphql');

export default defineConfig({
  resolve: { alias: [{ find: /^graphql$/, replacement: graphql }] },
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
