import type { PrismaClientLike, PrismaTransaction } from '../../src/stores/sql/drivers/prisma.js';
import { prismaStore } from '../../src/stores/sql/drivers/prisma.js';
import type { OrmUnderTest } from '../conformance/orm-suite.js';

/**
 * A Prisma client as the ORM suites drive it, on any provider: `insert` is the provider's
 * statement for a row of defaults into `{table}` (`INSERT INTO {table} DEFAULT VALUES`).
 */
export function prismaUnderTest<Client extends PrismaClientLike & { $disconnect(): Promise<void> }>(
  prisma: Client,
  insert: string,
): OrmUnderTest<PrismaTransaction<Client>> {
  return {
    store: (options) => prismaStore(prisma, options),
    insert: (tx, table) => tx.$executeRawUnsafe(insert.replace('{table}', table)),
    // Prisma 7 nests an interactive transaction on a transaction client as a savepoint.
    nested: (tx, work) => tx.$transaction((inner: PrismaTransaction<Client>) => work(inner)),
    rawCommit: (tx) => tx.$executeRawUnsafe('COMMIT'),
    close: () => prisma.$disconnect(),
  };
}
