import { PrismaBetterSqlite3 } from '@prisma/adapter-better-sqlite3';
import { describe } from 'vitest';
import type { PrismaTransaction } from '../src/stores/sql/drivers/prisma.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';
import { PrismaClient } from './fixtures/prisma/sqlite/generated/client.js';
import { prismaUnderTest } from './support/prisma-under-test.js';

type Tx = PrismaTransaction<InstanceType<typeof PrismaClient>>;

describe('prisma on SQLite (@prisma/adapter-better-sqlite3)', () => {
  describeSqliteOrmStore<Tx>(
    'prisma',
    async (url) => {
      const prisma = new PrismaClient({ adapter: new PrismaBetterSqlite3({ url }) });
      return prismaUnderTest(prisma, 'INSERT INTO {table} DEFAULT VALUES');
    },
    (tx, sql) => tx.$executeRawUnsafe(sql),
  );
});
