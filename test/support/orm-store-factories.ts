import { PrismaPg } from '@prisma/adapter-pg';
import { drizzle as drizzleMysqlOrm } from 'drizzle-orm/mysql2';
import { drizzle as drizzleOrm } from 'drizzle-orm/node-postgres';
import knexFactory from 'knex';
import { Kysely, MysqlDialect, PostgresDialect } from 'kysely';
import mysql2 from 'mysql2';
import mysql2Promise from 'mysql2/promise';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { PrismaClient } from '../../examples/orm/prisma/generated/client.js';
import { drizzleStore } from '../../src/stores/sql/drivers/drizzle.js';
import { knexStore } from '../../src/stores/sql/drivers/knex.js';
import { kyselyStore } from '../../src/stores/sql/drivers/kysely.js';
import { prismaStore } from '../../src/stores/sql/drivers/prisma.js';
import { typeormStore } from '../../src/stores/sql/drivers/typeorm.js';
import type { SqlStore } from '../../src/stores/sql/store.js';
import { dropSchemas, hasMysql, hasPostgres, mysqlDatabase, PG_URL, uniqueName } from './services.js';
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

/** An ORM's store on a database of its own on the test MariaDB; cleanup closes the ORM, drops the database. */
function mysqlOrmFactory(
  name: string,
  open: (url: string) => Promise<{ store: SqlStore<unknown>; close(): Promise<void> }>,
): StoreFactory {
  return {
    name: `${name} on MariaDB`,
    atomic: true,
    available: hasMysql,
    async open() {
      const database = await mysqlDatabase();
      const orm = await open(database.url);
      await orm.store.migrate();
      return {
        store: orm.store,
        async cleanup() {
          await orm.close();
          await database.drop();
        },
      };
    },
  };
}

export const drizzleMysql = mysqlOrmFactory('drizzle', async (url) => {
  const pool = mysql2Promise.createPool({ uri: url, connectionLimit: 10 });
  return { store: drizzleStore(drizzleMysqlOrm(pool)), close: () => pool.end() };
});

export const kyselyMysql = mysqlOrmFactory('kysely', async (url) => {
  const db = new Kysely<any>({
    dialect: new MysqlDialect({ pool: mysql2.createPool({ uri: url, connectionLimit: 10 }) }),
  });
  return { store: kyselyStore(db), close: () => db.destroy() };
});

export const knexMysql = mysqlOrmFactory('knex', async (url) => {
  const instance = knexFactory({ client: 'mysql2', connection: url, pool: { min: 0, max: 10 } });
  return { store: knexStore(instance), close: () => instance.destroy() };
});

export const typeormMysql = mysqlOrmFactory('typeorm', async (url) => {
  const dataSource = await new DataSource({ type: 'mariadb', url, poolSize: 10 }).initialize();
  return { store: typeormStore(dataSource), close: () => dataSource.destroy() };
});
