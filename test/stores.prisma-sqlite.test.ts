import { PrismaBetterSqlite3 } from '@prisma/adapter-better-sqlite3';
import { describe } from 'vitest';
import { type PrismaTransaction, prismaStore } from '../src/stores/sql/drivers/prisma.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';
import { PrismaClient } from './fixtures/prisma/sqlite/generated/client.js';

type Tx = PrismaTransaction<InstanceType<typeof PrismaClient>>;

describe('prisma on SQLite (@prisma/adapter-better-sqlite3)', () => {
  describeSqliteOrmStore<Tx>(
    'prisma',
    async (url) => {
      const prisma = new PrismaClient({ adapter: new PrismaBetterSqlite3({ url }) });
      return {
        store: (options) => prismaStore(prisma, options),
        insert: (tx, table) => tx.$executeRawUnsafe(`INSERT INTO ${table} DEFAULT VALUES`),
        // Prisma 7 nests an interactive transaction on a transaction client as a savepoint.
        nested: (tx, work) => tx.$transaction((inner) => work(inner)),
        rawCommit: (tx) => tx.$executeRawUnsafe('COMMIT'),
        close: () => prisma.$disconnect(),
      };
    },
    (tx, sql) => tx.$executeRawUnsafe(sql),
  );
});
