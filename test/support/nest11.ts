import { createRequire } from 'node:module';

/** A module of test/nest11's own install (NestJS 11), required as NestJS 11's packages require each other. */
export const requireNest11 = createRequire(new URL('../nest11/package.json', import.meta.url));
