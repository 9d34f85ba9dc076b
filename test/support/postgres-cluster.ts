import { execFile } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { promisify } from 'node:util';
import pg from 'pg';
import { PG_URL } from './services.js';

const run = promisify(execFile);

/** Restarts or starts the machine's PostgreSQL cluster; only the serial fault tests may do this. */
export function pgctl(action: 'restart' | 'start') {
  const version = readdirSync('/etc/postgresql')[0] ?? '';
  return run('pg_ctlcluster', ['--skip-systemctl-redirect', version, 'main', action]);
}

/** Whether PostgreSQL answers a query now. */
export async function databaseUp(): Promise<boolean> {
  const client = new pg.Client({ connectionString: PG_URL, connectionTimeoutMillis: 1000 });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}
