import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { describeNest } from './support/nest-specifics.js';

describeNest('nest 12');

// Nest's deep paths (@nestjs/common/constants.js, its enums) are internal and change between
// majors; the adapter reads what it needs through the public entry points only.
it("imports only Nest's public entry points", () => {
  const source = readFileSync(join(import.meta.dirname, '../src/adapters/nestjs.ts'), 'utf8');
  const nest = [...source.matchAll(/from '(@nestjs\/[^']+)'/g)].map((match) => match[1]);
  expect(nest.length).toBeGreaterThan(0);
  expect(nest.filter((specifier) => !/^@nestjs\/[a-z-]+$/.test(specifier as string))).toEqual([]);
});
