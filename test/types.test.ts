import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { expect, it } from 'vitest';

// test/types/ holds compile-time tests: `@ts-expect-error` lines that must fail to compile and
// assertions on inferred types. They declare a `Register` augmentation, so they compile apart
// from the rest of the project.
it('the type tests compile under strict mode', { timeout: 60_000 }, () => {
  const root = join(import.meta.dirname, '..');
  let output = '';
  try {
    execFileSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', 'test/types'], {
      cwd: root,
      encoding: 'utf8',
    });
  } catch (error) {
    output = String((error as { stdout?: string }).stdout);
  }
  expect(output).toBe('');
});
