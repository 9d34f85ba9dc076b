import { PrismaMariaDb } from '@prisma/adapter-mariadb';
import { describe, expect, it } from 'vitest';
import { type PrismaTransaction, prismaStore } from '../src/stores/sql/drivers/prisma.js';
import { describeMysqlOrmStore } from './conformance/orm-mysql-suite.js';
import { PrismaClient } from './fixtures/prisma/mysql/generated/client.js';
import { prismaUnderTest } from './support/prisma-under-test.js';
import { hasMysql, mysqlDatabase } from './support/services.js';
import { claimInput, textResponse } from './support/store-calls.js';

type Tx = PrismaTransaction<InstanceType<typeof PrismaClient>>;

/** A Prisma client on the MariaDB database at `url` (a `mysql://` URL), on the text protocol or the binary one (prepared statements, the adapter's default). */
const prismaOn = (url: string, useTextProtocol: boolean) =>
  new PrismaClient({ adapter: new PrismaMariaDb(url.replace(/^mysql:/, 'mariadb:'), { useTextProtocol }) });

describe.skipIf(!hasMysql)('prisma on MariaDB (@prisma/adapter-mariadb)', () => {
  describeMysqlOrmStore<Tx>('prisma', async (url) =>
    prismaUnderTest(prismaOn(url, true), 'INSERT INTO {table} () VALUES ()'),
  );

  it('on prepared statements the migration is refused naming the fix; the store runs on a table made otherwise', async () => {
    const database = await mysqlDatabase();
    const prepared = prismaOn(database.url, false);
    const text = prismaOn(database.url, true);
    try {
      const store = prismaStore(prepared, { migrate: true });
      await expect(store.migrate()).rejects.toThrow(/useTextProtocol: true.*retrysafe migrate/);
      await prismaStore(text).migrate();
      await text.$executeRawUnsafe(
        'CREATE TABLE prisma_orders (id int AUTO_INCREMENT PRIMARY KEY, item text NOT NULL)',
      );
      const input = claimInput('prepared');
      const result = await store.atomic(input, async (tx) => {
        await tx.order.create({ data: { item: 'prepared' } });
        return { response: textResponse('ok'), commit: true };
      });
      expect(result).toMatchObject({ outcome: 'executed', committed: true });
      expect(await text.order.count()).toBe(1);
      expect(
        await store.atomic(input, async () => ({ response: textResponse('again'), commit: true })),
      ).toMatchObject({ outcome: 'replay' });
    } finally {
      await prepared.$disconnect();
      await text.$disconnect();
      await database.drop();
    }
  });
});
