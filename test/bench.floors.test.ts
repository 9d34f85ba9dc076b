import { join } from 'node:path';
import mysql from 'mysql2/promise';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { chargesFor, startPaymentProvider } from './support/fines.js';
import { tempDatabaseUrl } from './support/loan-desk.js';
import { dropSchemas, hasMysql, hasPostgres, MYSQL_URL, PG_URL, uniqueName } from './support/services.js';

// The PostgreSQL and MariaDB floors of the bench (bench/servers/floor.js) are what "close to the limit" means
// in its report, so they must give the guarantee the loan desk gives: one loan per key, the same
// answer to every duplicate, a 409 for another body under the key.
const FLOOR = join(import.meta.dirname, '..', 'bench', 'servers', 'floor.js');
const LOAN = { member: 'U-1001', isbn: 'K-01', issuedAt: '2026-11-29' };
const DUPLICATES = 20;

/** A POST with an Idempotency-Key: its status and the text of its body. */
async function post(url: string, key: string, body: object, path = '/loans') {
  const response = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: await response.text() };
}

/** A loan floor's guarantee, whatever its database: `loans()` counts the loan rows. */
async function expectOneLoanPerKey(url: string, loans: () => Promise<number>) {
  const answers = await Promise.all(Array.from({ length: DUPLICATES }, () => post(url, 'same-key', LOAN)));
  expect(new Set(answers.map((answer) => `${answer.status} ${answer.body}`)).size).toBe(1);
  expect(answers[0]!.status).toBe(201);
  expect(await loans()).toBe(1);

  expect((await post(url, 'same-key', { ...LOAN, isbn: 'K-02' })).status).toBe(409);
  const missing = await post(url, 'other-key', { ...LOAN, member: 'U-0000' });
  expect(missing.status).toBe(422);
  expect(await post(url, 'other-key', { ...LOAN, member: 'U-0000' })).toEqual(missing);
  expect(await loans()).toBe(1);
}

describe.skipIf(!hasPostgres).each(['postgres', 'postgres-3rt'])('bench floor FLOOR=%s', (floor) => {
  const schema = uniqueName('rs_floor');
  let server: { url: string; stop(): Promise<void> } | undefined;

  afterAll(async () => {
    await server?.stop();
    await dropSchemas(schema);
  });

  it('lends once for concurrent duplicates and answers each with the same response', async () => {
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    try {
      await admin.query(`CREATE SCHEMA "${schema}"`);
      const { startServer } = await import('../bench/lib/proc.js');
      const url = new URL(PG_URL);
      url.searchParams.set('schema', schema);
      server = await startServer(FLOOR, { env: { FLOOR: floor, DATABASE_URL: url.toString() } });
      await expectOneLoanPerKey(
        server.url,
        async () => (await admin.query(`SELECT count(*)::int AS n FROM "${schema}".loan`)).rows[0].n,
      );
    } finally {
      await admin.end();
    }
  });
});

// The fines floor (bench/servers/fines-floor.js) stands for "the same guarantee by hand" in the
// fines scenario: one fine and one charge per key, every retry the same answer, 409 for another body.
describe('bench fines floor', () => {
  it('pays once per key: duplicates get the first answer or 409, one fine, one charge', async () => {
    const { startServer } = await import('../bench/lib/proc.js');
    const provider = await startPaymentProvider();
    const floor = await startServer(join(import.meta.dirname, '..', 'bench', 'servers', 'fines-floor.js'), {
      env: { DATABASE_URL: tempDatabaseUrl('fines-floor'), PROVIDER_URL: provider.url },
    });
    try {
      const pay = (body: object) => post(floor.url, 'floor-fine-1', body, '/fines');
      const fine = { member: 'U-1001', amount: 500 };
      const answers = await Promise.all(Array.from({ length: DUPLICATES }, () => pay(fine)));
      const paid = answers.filter((answer) => answer.status === 201);
      expect(paid.length + answers.filter((answer) => answer.status === 409).length).toBe(DUPLICATES);
      expect(new Set(paid.map((answer) => answer.body)).size).toBe(1);
      const { id } = JSON.parse((await pay(fine)).body);
      expect(await chargesFor(provider, id)).toHaveLength(1);
      expect((await pay({ ...fine, amount: 501 })).status).toBe(409);
    } finally {
      await floor.stop();
      await provider.close();
    }
  });
});

describe.skipIf(!hasMysql)('bench floor FLOOR=mysql', () => {
  const url = new URL(MYSQL_URL);
  url.pathname = `/${uniqueName('retrysafe_floor')}`;
  let server: { url: string; stop(): Promise<void> } | undefined;

  afterAll(async () => {
    await server?.stop();
    const admin = await mysql.createConnection({ uri: MYSQL_URL });
    await admin.query(`DROP DATABASE IF EXISTS \`${url.pathname.slice(1)}\``);
    await admin.end();
  });

  it('lends once for concurrent duplicates and answers each with the same response', async () => {
    const { startServer } = await import('../bench/lib/proc.js');
    server = await startServer(FLOOR, { env: { FLOOR: 'mysql', DATABASE_URL: url.toString() } });
    const loans = async () => {
      const connection = await mysql.createConnection({ uri: url.toString() });
      try {
        const [rows] = await connection.query<mysql.RowDataPacket[]>('SELECT count(*) AS n FROM loan');
        return Number(rows[0]!.n);
      } finally {
        await connection.end();
      }
    };
    await expectOneLoanPerKey(server.url, loans);
  });
});

// The SQLite floor is also the shipped desk's keyless reference: a POST with no key lends, alone in
// one transaction, as the desk's keyless POST does.
describe('bench floor FLOOR=sqlite', () => {
  let server: { url: string; stop(): Promise<void> } | undefined;
  const file = tempDatabaseUrl('floor');

  afterAll(async () => {
    await server?.stop();
  });

  it('lends once per key, and once per POST that carries no key', async () => {
    const { startServer } = await import('../bench/lib/proc.js');
    server = await startServer(FLOOR, { env: { FLOOR: 'sqlite', DATABASE_URL: file } });
    const { default: Database } = await import('better-sqlite3');
    const loans = async () => {
      const db = new Database(file, { readonly: true });
      try {
        return (db.prepare('SELECT count(*) AS n FROM loan').get() as { n: number }).n;
      } finally {
        db.close();
      }
    };
    await expectOneLoanPerKey(server.url, loans);
    const keyless = () =>
      fetch(`${server!.url}/loans`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(LOAN),
      });
    const [first, second] = [await keyless(), await keyless()];
    expect([first.status, second.status]).toEqual([201, 201]);
    expect((await first.json()).id).not.toBe((await second.json()).id);
    expect(await loans()).toBe(3);
  });
});
