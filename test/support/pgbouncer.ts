import { existsSync } from 'node:fs';
import { freePort } from './free-port.js';
import { PGBOUNCER, type PgBouncer, startPgBouncer as startOn } from './pgbouncer-process.js';
import { PG_URL } from './services.js';

export type { PgBouncer };

function pgbouncerInstalled(): boolean {
  if (existsSync(PGBOUNCER)) return true;
  const message = `${PGBOUNCER} is missing (apt-get install pgbouncer)`;
  if (process.env.CI === 'true') throw new Error(`${message}; CI=true makes the PgBouncer tests mandatory`);
  console.warn(`\n!!!!!!!! SKIPPING PgBouncer TESTS: ${message} !!!!!!!!\n`);
  return false;
}

/** Whether the PgBouncer tests can run: pgbouncer installed (PostgreSQL is checked by services.ts). */
export const hasPgBouncer = pgbouncerInstalled();

/** A pgbouncer of its own in front of the machine's PostgreSQL (`PG_URL`): see pgbouncer-process.js. */
export async function startPgBouncer(
  options: { poolSize?: number; users?: string[] } = {},
): Promise<PgBouncer> {
  return startOn(PG_URL, { ...options, port: await freePort() });
}
