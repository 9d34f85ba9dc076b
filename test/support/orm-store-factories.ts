import { PrismaPg } from '@prisma/adapter-pg';
import { drizzle as drizzleOrm } from 'drizzle-orm/node-postgres';
import knexFactory from 'knex';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { PrismaClient } from '../../examples/orm/prisma/generated/client.js';
import { drizzleStore } from '../../src/stores/sql/drivers/drizzle.js';
import { knexStore } from '../../src/stores/sql/drivers/knex.js';
import { kyselyStore } from '../../src/stores/sql/drivers/kysely.js';
import { prismaStore } from '../../src/stores/sql/drivers/prisma.js';
import { typeormStore } from '../../src/stores/sql/drivers/typeorm.js';
import type { SqlStore } from '../../src/stores/sql/store.js';
import { dropSchemas, hasPostgres, PG_URL, uniqueName } from './services.js';
import type { StoreFactory } from './store-factories.js';

// The ORM stores as store-factories.ts's stores are given to the adapter suites: kept apart so
// that the suites which do not run them load no ORM.

/** An ORM's store on the test PostgreSQL in a schema of its own; cleanup closes the ORM, drops the schema. */
function ormFactory(
  name: string,
  open: (schema: string) => Promise<{ store: SqlStore<unknown>; close(): Promise<void> }>,
): StoreFactory {
  return {
    name,
    atomic: true,
    available: hasPostgres,
    async open() {
      const schema = uniqueName(`rs_adapter_${name}`);
      const orm = await open(schema);
      await orm.store.migrate();
      return {
        store: orm.store,
        async cleanup() {
          // The store leaves the ORM's connections open: they are the application's.
          await orm.close();
          await dropSchemas(schema);
        },
      };
    },
  };
}

export const drizzle = ormFactory('drizzle', async (schema) => {
  const pool = new pg.Pool({ connectionString: PG_URL, max: 10 });
  return { store: drizzleStore(drizzleOrm(pool), { schema }), close: () => pool.end() };
});

export const kysely = ormFactory('kysely', async (schema) => {
  const db = new Kysely<any>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: 10 }) }),
  });
  return { store: kyselyStore(db, { schema }), close: () => db.destroy() };
});

export const knex = ormFactory('knex', async (schema) => {
  const instance = knexFactory({ client: 'pg', connection: PG_URL, pool: { min: 0, max: 10 } });
  return { store: knexStore(instance, { schema }), close: () => instance.destroy() };
});

export const typeorm = ormFactory('typeorm', async (schema) => {
  const dataSource = await new DataSource({ type: 'postgres', url: PG_URL, poolSize: 10 }).initialize();
  return { store: typeormStore(dataSource, { schema }), close: () => dataSource.destroy() };
});

/** The quick start's generated client (test/support/build.ts makes it), through @prisma/adapter-pg. */
export const prisma = ormFactory('prisma', async (schema) => {
  const client = new PrismaClient({ adapter: new PrismaPg({ connectionString: PG_URL, max: 10 }) });
  return { store: prismaStore(client, { schema }), close: () => client.$disconnect() };
});
