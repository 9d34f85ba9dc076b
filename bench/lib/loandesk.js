import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { startServer } from './proc.js';
import { mysqlDatabaseUrl, pgSchemaUrl, REDIS_URL, withMysql, withPg } from './services.js';

export const LOAN_DESK = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  '../../examples/library-loans/server.js',
);

/** The loan desk configurations issue 6 compares. */
export const VARIANTS = [
  { id: 'sqlite-atomic', label: 'SQLite, atomic', db: 'sqlite', mode: 'atomic' },
  { id: 'sqlite-lease', label: 'SQLite, lease', db: 'sqlite', mode: 'lease' },
  { id: 'memory', label: 'memory store (SQLite data)', db: 'sqlite', store: 'memory', mode: 'lease' },
  { id: 'postgres-atomic', label: 'PostgreSQL, atomic', db: 'postgres', mode: 'atomic' },
  { id: 'postgres-lease', label: 'PostgreSQL, lease', db: 'postgres', mode: 'lease' },
  { id: 'mysql-atomic', label: 'MariaDB, atomic', db: 'mysql', mode: 'atomic' },
  { id: 'redis', label: 'Redis store (SQLite data), lease', db: 'sqlite', store: 'redis', mode: 'lease' },
];

export const LOAN = { member: 'U-1001', isbn: 'K-01', issuedAt: '2026-11-29' };

/**
 * Starts the loan desk for one variant on its own fresh database (`env` on top, `desk` another copy
 * of server.js, the rest of the options to startServer); `count()` counts its loans.
 */
export async function startLoanDesk(
  ctx,
  variant,
  { tag = '', env: extraEnv = {}, desk = LOAN_DESK, ...start } = {},
) {
  const name = `${variant.id}${tag}`.replaceAll('-', '_');
  let databaseUrl;
  let count;
  if (variant.db === 'postgres') {
    const schema = `${ctx.runId}_${name}`;
    databaseUrl = await pgSchemaUrl(schema);
    count = () =>
      withPg(async (client) =>
        Number((await client.query(`SELECT count(*) AS n FROM "${schema}".loan`)).rows[0].n),
      );
  } else if (variant.db === 'mysql') {
    databaseUrl = mysqlDatabaseUrl(`${ctx.runId}_${name}`);
    count = () =>
      withMysql(databaseUrl, async (connection) =>
        Number((await connection.query('SELECT count(*) AS n FROM loan'))[0][0].n),
      );
  } else {
    databaseUrl = path.join(ctx.tmpDir, `${name}.db`);
    count = () => {
      const db = new Database(databaseUrl, { readonly: true, fileMustExist: true });
      try {
        return db.prepare('SELECT count(*) AS n FROM loan').get().n;
      } finally {
        db.close();
      }
    };
  }
  // The desk as `npm start` runs it: receipts and the completer on (a variant's `env` may differ).
  const env = { DATABASE_URL: databaseUrl, IDEMPOTENCY_MODE: variant.mode, ...variant.env, ...extraEnv };
  // Its Redis keys hold the request's key, and so the run id that cleanup() looks for.
  if (variant.driver) env.SQLITE_DRIVER = variant.driver;
  if (variant.store) env.IDEMPOTENCY_STORE = variant.store === 'redis' ? REDIS_URL : variant.store;
  const server = await startServer(desk, { ...start, env, ipcReady: false });
  return Object.assign(server, { countLoans: count, databaseUrl });
}

/** `--cpu-prof` arguments when the run was started with `--profile`. */
export function profileArgs(ctx, label) {
  if (!ctx.profileDir) return [];
  return ['--cpu-prof', `--cpu-prof-dir=${ctx.profileDir}`, `--cpu-prof-name=${label}.cpuprofile`];
}

/** The hand-written floors (servers/floor.js), one per `FLOOR`. */
export const FLOOR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../servers/floor.js');

/** The hand-written floor of each loan desk variant that has one (bench/servers/floor.js). */
export const FLOOR_OF = {
  'sqlite-atomic': 'sqlite',
  'postgres-atomic': 'postgres',
  'mysql-atomic': 'mysql',
  redis: 'redis',
};

/**
 * The floor with the structure a library must have, where it differs from the one above: the
 * handler's statement runs between the claim and the saved response.
 */
export const STRUCTURAL_FLOOR_OF = { 'postgres-atomic': 'postgres-3rt' };

/**
 * Starts a floor server (`sqlite`, `postgres`, `postgres-3rt`, `mysql`, `redis` or `cheapest`) on its own
 * fresh database.
 */
export async function startFloor(ctx, floor, start = {}) {
  const name = `floor_${floor}`.replaceAll('-', '_');
  const env = { FLOOR: floor, REDIS_URL };
  if (floor.startsWith('postgres')) env.DATABASE_URL = await pgSchemaUrl(`${ctx.runId}_${name}`);
  else if (floor === 'mysql') env.DATABASE_URL = mysqlDatabaseUrl(`${ctx.runId}_${name}`);
  else env.DATABASE_URL = path.join(ctx.tmpDir, `${name}.db`);
  return startServer(FLOOR, { ...start, env });
}
