import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { PrismaPg } from '@prisma/adapter-pg';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PrismaClient } from '../examples/orm/prisma/generated/client.js';
import { idempotency } from '../src/adapters/node.js';
import type { ClaimInput } from '../src/core/contract/index.js';
import { postgresStatements } from '../src/stores/postgres/statements.js';
import {
  answersRows,
  type PrismaTransaction,
  prismaDriver,
  prismaErrorCode,
  prismaStore,
} from '../src/stores/sql/drivers/prisma.js';
import { describeIdempotentConformance } from './conformance/idempotent-suite.js';
import { describeStoreConformance, type StoreUnderTest } from './conformance/store-suite.js';
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

/** A Prisma store in a schema of its own; the atomic-mode probe writes through the ORM's tx. */
async function prismaUnderTest(): Promise<StoreUnderTest> {
  const schema = uniqueName('rs_prisma_conf');
  const db = await prismaIn(schema);
  const store = prismaStore(db.prisma, { schema });
  await store.migrate();
  return {
    store,
    atomicProbe: {
      // The application's own write, through the ORM on the operation's transaction.
      write: async (tx: Tx) => void (await tx.order.create({ data: { item: 'probe' } })),
      count: db.count,
      commit: async (tx: Tx) => void (await tx.$executeRawUnsafe('COMMIT')),
    },
    cleanup: db.close,
  };
}

describe.skipIf(!hasPostgres)('prisma', () => {
  describeStoreConformance('prisma 7 + @prisma/adapter-pg (lease and atomic mode)', prismaUnderTest);
  describeIdempotentConformance('prisma', prismaUnderTest);
});

describe('prisma driver without a database', () => {
  it('sends statements that answer rows to $queryRawUnsafe and the others to $executeRawUnsafe', () => {
    const s = postgresStatements('"s"."t"');
    const rows = [s.CLAIM, s.TAKE_OVER, s.LEASE_LEFT, s.COMPLETE, s.LOCK_OWNED, s.ABANDONED, s.RELEASE];
    const counts = [
      s.SAVE_STEP,
      s.RENEW,
      s.PURGE,
      'CREATE TABLE x (a int)',
      'SAVEPOINT a',
      'RELEASE SAVEPOINT a',
    ];
    for (const sql of [...rows, s.DELETE, s.ATOMIC_COMPLETE, s.GET]) expect(answersRows(sql), sql).toBe(true);
    for (const sql of counts) expect(answersRows(sql), sql).toBe(false);
    expect(answersRows("WITH a AS (SELECT ')' AS p) UPDATE t SET p = a.p FROM a")).toBe(false);
    expect(answersRows('WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a RETURNING id')).toBe(true);
  });

  it('refuses what is not a Prisma client, naming what it wants', () => {
    expect(() => prismaStore({} as never)).toThrow(/give a PrismaClient/);
    expect(() => prismaDriver(null as never)).toThrow(/give a PrismaClient/);
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

  it("a handler's own tx.$transaction(async …) is a savepoint: a throw after it leaves no row and the key free", async () => {
    const key = input();
    const before = await db.count();
    const failure = new Error('failed after the nested transaction');
    await expect(
      store.atomic(key, async (tx) => {
        await tx.$transaction(async (inner) => {
          await inner.order.create({ data: { item: 'nested' } });
        });
        throw failure;
      }),
    ).rejects.toBe(failure);
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

  it('a raw COMMIT run by the handler on tx is caught: the call fails and a retry does not write again', async () => {
    const key = input();
    let runs = 0;
    const work = async (tx: Tx) => {
      runs++;
      await tx.order.create({ data: { item: 'committed-early' } });
      await tx.$executeRawUnsafe('COMMIT');
      return { response: textResponse('made'), commit: true };
    };
    await expect(store.atomic(key, work)).rejects.toThrow();
    const retry = await store.atomic(key, work).catch((error: unknown) => error);
    expect(retry).not.toMatchObject({ outcome: 'executed' });
    expect(runs).toBe(1);
    expect(await db.prisma.order.count({ where: { item: 'committed-early' } })).toBeLessThanOrEqual(1);
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

// What a handler may do with Prisma's own transaction API on `idem.tx`, through the engine over HTTP.
describe.skipIf(!hasPostgres)("prisma: a handler's own transaction calls, through the engine", () => {
  const schema = uniqueName('rs_prisma_http');
  const admin = new pg.Pool({ connectionString: PG_URL, max: 1 });
  const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: PG_URL }, { schema }) });
  const store = prismaStore(prisma, { schema, migrate: true });
  const runs = new Map<string, number>();
  let server: http.Server;
  let url: string;

  const handler = idempotency({ store, mode: 'atomic' })(async (req, res, idem) => {
    const item = String(req.body);
    runs.set(item, (runs.get(item) ?? 0) + 1);
    const tx = idem?.tx;
    if (!tx) throw new Error('send a key');
    if (item.startsWith('nested-then-throw')) {
      await tx.$transaction(async (inner) => inner.order.create({ data: { item } }));
      throw new Error('failed after the nested transaction committed its savepoint');
    }
    if (item.startsWith('raw-commit')) {
      await tx.order.create({ data: { item } });
      await tx.$executeRawUnsafe('COMMIT');
    }
    res.writeHead(201).end(item);
  });

  const post = async (item: string, key: string) => {
    const response = await fetch(`${url}/orders`, {
      method: 'POST',
      headers: { 'idempotency-key': key },
      body: item,
    });
    await response.arrayBuffer();
    return response.status;
  };
  const rows = async (item: string) =>
    Number(
      (await admin.query(`SELECT count(*) FROM "${schema}".prisma_orders WHERE item = $1`, [item])).rows[0]
        .count,
    );

  beforeAll(async () => {
    await admin.query(`CREATE SCHEMA "${schema}"`);
    await admin.query(`CREATE TABLE "${schema}".prisma_orders (id serial PRIMARY KEY, item text NOT NULL)`);
    server = http.createServer(handler).listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });

  afterAll(async () => {
    await new Promise((resolve) => server?.close(resolve));
    await store.close();
    await prisma.$disconnect();
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.end();
  });

  it('tx.$transaction(async …) then a throw: 500, no row, and the retry runs again', async () => {
    const item = `nested-then-throw-${uniqueName()}`;
    expect(await post(item, item)).toBe(500);
    expect(await post(item, item)).toBe(500);
    expect(runs.get(item)).toBe(2);
    expect(await rows(item)).toBe(0);
  });

  it('a raw COMMIT on tx: a 5xx answer, and a retry does not run the write again', async () => {
    const item = `raw-commit-${uniqueName()}`;
    expect(await post(item, item)).toBeGreaterThanOrEqual(500);
    expect(await post(item, item)).toBeGreaterThanOrEqual(500);
    expect(runs.get(item)).toBe(1);
    expect(await rows(item)).toBeLessThanOrEqual(1);
  });
});
