import { PrismaPg } from '@prisma/adapter-pg';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PrismaClient } from '../examples/orm/prisma/generated/client.js';
import type { ClaimInput } from '../src/core/contract/index.js';
import { postgresStatements } from '../src/stores/postgres/statements.js';
import {
  type PrismaTransaction,
  prismaDriver,
  prismaErrorCode,
  prismaStore,
} from '../src/stores/sql/drivers/prisma.js';
import { statementKind } from '../src/stores/sql/drivers/statement-kind.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { prismaUnderTest } from './support/prisma-under-test.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';
import { textResponse } from './support/store-calls.js';

/** A Prisma client whose queries go to `schema`, which holds the example's `prisma_orders` table. */
async function prismaIn(schema: string) {
  const admin = new pg.Pool({ connectionString: PG_URL, max: 2 });
  await admin.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
  await admin.query(`CREATE TABLE "${schema}".prisma_orders (id serial PRIMARY KEY, item text NOT NULL)`);
  const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: PG_URL }, { schema }) });
  return {
    prisma,
    admin,
    count: async () =>
      Number((await admin.query(`SELECT count(*) FROM "${schema}".prisma_orders`)).rows[0].count),
    async close() {
      await prisma.$disconnect();
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await admin.end();
    },
  };
}

type Prisma = InstanceType<typeof PrismaClient>;
type Tx = PrismaTransaction<Prisma>;

describe.skipIf(!hasPostgres)('prisma', () => {
  describeOrmStore<Tx>('prisma', async () => {
    const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: PG_URL }) });
    return prismaUnderTest(prisma, 'INSERT INTO {table} DEFAULT VALUES');
  });
});

describe('prisma driver without a database', () => {
  it('sends statements that answer rows to $queryRawUnsafe and the others to $executeRawUnsafe', () => {
    const s = postgresStatements('"s"."t"');
    const selects = [s.CLAIM, s.LEASE_LEFT, s.COMPLETE, s.LOCK_OWNED, s.ABANDONED, s.RELEASE, s.DELETE];
    for (const sql of [...selects, s.ATOMIC_COMPLETE, s.GET]) expect(statementKind(sql), sql).toBe('select');
    expect(statementKind(s.TAKE_OVER)).toBe('returning');
    const counts = [
      s.SAVE_STEP,
      s.RENEW,
      s.PURGE,
      'CREATE TABLE x (a int)',
      'SAVEPOINT a',
      'RELEASE SAVEPOINT a',
    ];
    for (const sql of counts) expect(statementKind(sql), sql).toBe('count');
    expect(statementKind("WITH a AS (SELECT ')' AS p) UPDATE t SET p = a.p FROM a")).toBe('count');
    expect(statementKind('WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a RETURNING id')).toBe(
      'returning',
    );
  });

  it('refuses what is not a Prisma client, naming what it wants', () => {
    expect(() => prismaStore({} as never)).toThrow(/give a PrismaClient/);
    expect(() => prismaDriver(null as never)).toThrow(/give a PrismaClient/);
  });

  it("speaks the generated client's provider, and refuses one it has no dialect for", () => {
    const client = (provider: string) => ({
      _activeProvider: provider,
      $queryRawUnsafe: async <T>(): Promise<T> => [] as T,
      $executeRawUnsafe: async () => 0,
      $transaction: async <R>(fn: (tx: any) => Promise<R>): Promise<R> => fn('tx'),
    });
    expect(prismaDriver(client('postgresql')).dialect).toBe('postgres');
    expect(prismaDriver(client('mysql')).dialect).toBe('mysql');
    expect(prismaDriver(client('sqlite')).dialect).toBe('sqlite');
    expect(() => prismaDriver(client('sqlserver'))).toThrow(/provider is sqlserver/);
    // SQLite's rows come from PRAGMA statements too.
    expect(statementKind('PRAGMA table_info(t)')).toBe('select');
  });

  it("opens Prisma's interactive transaction with generous limits, or the ones given", async () => {
    const seen: unknown[] = [];
    const fake = {
      $queryRawUnsafe: async <T>(): Promise<T> => [] as T,
      $executeRawUnsafe: async () => 0,
      $transaction: async <R>(fn: (tx: any) => Promise<R>, options?: unknown): Promise<R> => {
        seen.push(options);
        return fn('tx');
      },
    };
    expect(await prismaDriver(fake).transaction(async (tx) => tx)).toBe('tx');
    await prismaDriver(fake, { timeout: 300_000 }).transaction(async () => undefined);
    expect(seen).toEqual([
      { maxWait: 10_000, timeout: 60_000 },
      { maxWait: 10_000, timeout: 300_000 },
    ]);
  });

  it("finds PostgreSQL's SQLSTATE under Prisma's wrapping, never Prisma's own code", () => {
    const wrapped = Object.assign(new Error('Raw query failed'), {
      name: 'PrismaClientKnownRequestError',
      code: 'P2010',
      meta: {
        driverAdapterError: {
          name: 'DriverAdapterError',
          cause: { kind: 'postgres', originalCode: '55P03' },
        },
      },
    });
    expect(prismaErrorCode(wrapped)).toBe('55P03');
    const closed = Object.assign(new Error('Transaction already closed'), {
      name: 'PrismaClientKnownRequestError',
      code: 'P2028',
    });
    expect(prismaErrorCode(closed)).toBeUndefined();
    // @prisma/adapter-mariadb keeps MySQL's errno only: the store's codes are named as mysql2 names them.
    const mysql = (errno: string) => ({
      name: 'PrismaClientKnownRequestError',
      code: 'P2010',
      meta: { driverAdapterError: { cause: { kind: 'mysql', originalCode: errno } } },
    });
    expect(prismaErrorCode(mysql('1146'), 'mysql')).toBe('ER_NO_SUCH_TABLE');
    expect(prismaErrorCode(mysql('1205'), 'mysql')).toBe('ER_LOCK_WAIT_TIMEOUT');
    expect(prismaErrorCode(mysql('1062'), 'mysql')).toBe('1062');
  });
});

describe.skipIf(!hasPostgres)('prisma driver specifics', () => {
  const schema = uniqueName('rs_prisma');
  let db: Awaited<ReturnType<typeof prismaIn>>;
  let driver: ReturnType<typeof prismaDriver<Prisma>>;
  let store: ReturnType<typeof prismaStore<Prisma>>;
  let n = 0;
  const input = (): ClaimInput => ({
    scope: 'prisma',
    key: `k${++n}`,
    fingerprint: 'fp',
    leaseMs: 10_000,
    retainMs: 60_000,
  });

  beforeAll(async () => {
    db = await prismaIn(schema);
    driver = prismaDriver(db.prisma);
    store = prismaStore(db.prisma, { schema });
    await store.migrate();
    await db.admin.query(`CREATE TABLE "${schema}".blobs (id int PRIMARY KEY, body bytea, n bigint, j json)`);
  });

  afterAll(async () => {
    await store?.close();
    await db?.close();
  });

  it('round-trips bytea as bytes, reads bigint as text and json parsed; counts what it changed', async () => {
    const t = `"${schema}".blobs`;
    const bytes = Buffer.from([0, 1, 127, 128, 255]);
    const inserted = await driver.query(`INSERT INTO ${t} (id, body, n, j) VALUES ($1, $2, $3, $4)`, [
      1,
      bytes,
      '9007199254740993',
      '{"a":[1,"x"]}',
    ]);
    expect(inserted).toEqual({ rows: [], affected: 1 });
    const { rows } = await driver.query<{ body: Uint8Array; n: string; j: unknown; same: boolean }>(
      `SELECT body, n, j, body = $1 AS same FROM ${t} WHERE id = $2 AND id = $2`,
      [bytes, 1],
    );
    expect(rows[0]!.body).toBeInstanceOf(Uint8Array);
    expect(Buffer.from(rows[0]!.body)).toEqual(bytes);
    expect(rows[0]).toMatchObject({ n: '9007199254740993', j: { a: [1, 'x'] }, same: true });
    expect(await driver.query(`UPDATE ${t} SET n = n + 1 WHERE id = $1`, [1])).toEqual({
      rows: [],
      affected: 1,
    });
    expect(await driver.query(`UPDATE ${t} SET n = n + 1 WHERE id = $1 RETURNING n`, [1])).toEqual({
      rows: [{ n: '9007199254740995' }],
      affected: 1,
    });
    expect(await driver.query(`DELETE FROM ${t} WHERE id = $1`, [2])).toEqual({ rows: [], affected: 0 });
    // A plain Uint8Array (not a Buffer) goes as bytea too, an empty one included.
    const plain = await driver.query<{ b: Uint8Array; e: Uint8Array }>(
      'SELECT $1::bytea AS b, $2::bytea AS e',
      [new Uint8Array([1, 2]), new Uint8Array(0)],
    );
    expect(plain.rows.map(({ b, e }) => [[...b], [...e]])).toEqual([[[1, 2], []]]);
  });

  it("reports the database's error code from a failed statement, in and out of a transaction", async () => {
    const failure = await driver.query('SELECT 1 / 0', []).catch((error: unknown) => error);
    expect(driver.errorCode(failure)).toBe('22012');
    const inTx = await driver
      .transaction((tx) => driver.queryIn(tx, `INSERT INTO "${schema}".blobs (id) VALUES (NULL)`, []))
      .catch((error: unknown) => error);
    expect(driver.errorCode(inTx)).toBe('23502');
  });

  it("a handler that outlives the transaction's timeout is rolled back by Prisma (P2028): no row, the key free", async () => {
    const short = prismaStore(db.prisma, { schema, transactionOptions: { timeout: 200 } });
    const key = input();
    const before = await db.count();
    const failure = await short
      .atomic(key, async (tx) => {
        await tx.order.create({ data: { item: 'too-late' } });
        // Longer than the timeout: Prisma's timer rolls the transaction back first.
        await new Promise((resolve) => setTimeout(resolve, 600));
        return { response: textResponse('late'), commit: true };
      })
      .catch((error: unknown) => error);
    expect(failure).toMatchObject({ code: 'P2028' });
    expect(prismaErrorCode(failure)).toBeUndefined();
    expect(await db.count()).toBe(before);
    expect((await store.claim(key)).outcome).toBe('acquired');
  });

  it('a nested transaction that throws rolls back to its savepoint; the operation commits the rest', async () => {
    const key = input();
    const before = await db.count();
    const result = await store.atomic(key, async (tx) => {
      await tx.order.create({ data: { item: 'kept' } });
      await tx
        .$transaction(async (inner) => {
          await inner.order.create({ data: { item: 'dropped' } });
          throw new Error('inner');
        })
        .catch(() => undefined);
      return { response: textResponse('made'), commit: true };
    });
    expect(result).toMatchObject({ outcome: 'executed', committed: true });
    expect(await db.count()).toBe(before + 1);
    const items = await db.prisma.order.findMany({ where: { item: { in: ['kept', 'dropped'] } } });
    expect(items.map((order) => order.item)).toEqual(['kept']);
    expect((await store.claim(key)).outcome).toBe('replay');
  });

  it('the array form tx.$transaction([…]) is not part of the operation: Prisma runs it on another connection', async () => {
    // Documented in reference.md: only the callback form nests.
    const key = input();
    const escaped = await store
      .atomic(key, async (tx) => {
        await tx.$transaction([tx.order.create({ data: { item: 'escaped' } })]);
        throw new Error('rolled back');
      })
      .catch(() => undefined);
    expect(escaped).toBeUndefined();
    expect(await db.prisma.order.count({ where: { item: 'escaped' } })).toBe(1);
  });
});
