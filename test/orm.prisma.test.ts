import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { PrismaPg } from '@prisma/adapter-pg';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PrismaClient } from '../examples/orm/prisma/generated/client.js';
import { idempotency } from '../src/adapters/node.js';
import { prismaStore } from '../src/stores/sql/drivers/prisma.js';
import { describeOrmQuickStart } from './support/orm-app.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';

describe.skipIf(!hasPostgres)('orm: prisma', () => describeOrmQuickStart('prisma'));

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
