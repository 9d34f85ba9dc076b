// The ORM stores' `Tx` (checked by `tsc --noEmit`, strict; nothing here runs): a node:http
// handler's `idem.tx` is the ORM's own transaction object, typed by the ORM, and a handler nests
// the ORM's way on it.

import type { MySqlTransaction } from 'drizzle-orm/mysql-core';
import { drizzle as drizzleMysql, type MySql2Database } from 'drizzle-orm/mysql2';
import type { Knex } from 'knex';
import knexFactory from 'knex';
import { type ControlledTransaction, Kysely, PostgresDialect } from 'kysely';
import type { PoolConnection } from 'mysql2/promise';
import pg from 'pg';
import { DataSource, type EntityManager } from 'typeorm';
import { idempotency } from '../../src/adapters/node.js';
import { mysqlStore } from '../../src/stores/mysql/index.js';
import { type DrizzleTransaction, drizzleStore } from '../../src/stores/sql/drivers/drizzle.js';
import { knexStore } from '../../src/stores/sql/drivers/knex.js';
import { kyselyStore } from '../../src/stores/sql/drivers/kysely.js';
import { typeormStore } from '../../src/stores/sql/drivers/typeorm.js';

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function assertType<T extends true>(_: T): void {}

interface Shop {
  orders: { id: number; item: string };
}
const db = new Kysely<Shop>({ dialect: new PostgresDialect({ pool: new pg.Pool() }) });
idempotency({ store: kyselyStore(db), mode: 'atomic' })(async (_req, res, idem) => {
  assertType<Equal<NonNullable<typeof idem>['tx'], ControlledTransaction<Shop, any[]> | undefined>>(true);
  const tx = idem!.tx!;
  // The query builders of `Shop`, and Kysely's savepoints.
  await tx.insertInto('orders').values({ id: 1, item: 'book' }).execute();
  const nested = await tx.savepoint('sp').execute();
  await nested.releaseSavepoint('sp').execute();
  // @ts-expect-error: no such table in Shop
  await tx.insertInto('loans').values({}).execute();
  res.end();
});

const knex = knexFactory({ client: 'pg' });
idempotency({ store: knexStore(knex), mode: 'atomic' })(async (_req, res, idem) => {
  assertType<Equal<NonNullable<typeof idem>['tx'], Knex.Transaction | undefined>>(true);
  await idem!.tx!.transaction((nested) => nested('orders').insert({ item: 'book' }));
  res.end();
});

const dataSource = new DataSource({ type: 'postgres' });
idempotency({ store: typeormStore(dataSource), mode: 'atomic' })(async (_req, res, idem) => {
  assertType<Equal<NonNullable<typeof idem>['tx'], EntityManager | undefined>>(true);
  await idem!.tx!.transaction((nested) => nested.query('SELECT 1'));
  res.end();
});

// Drizzle on mysql2: its MySqlTransaction, with Drizzle's nesting.
const mysqlDb: MySql2Database = drizzleMysql('mysql://localhost/shop');
idempotency({ store: drizzleStore(mysqlDb), mode: 'atomic' })(async (_req, res, idem) => {
  type Tx = NonNullable<NonNullable<typeof idem>['tx']>;
  assertType<Equal<Tx, DrizzleTransaction<MySql2Database>>>(true);
  assertType<Tx extends MySqlTransaction<any, any, any, any> ? true : false>(true);
  await idem!.tx!.transaction(async (nested) => nested.execute('SELECT 1'));
  res.end();
});

// mysqlStore, the SQL store over its mysql2 driver: the pool connection holding the transaction.
idempotency({ store: mysqlStore({ url: 'mysql://localhost/shop' }), mode: 'atomic' })(
  async (_req, res, idem) => {
    assertType<Equal<NonNullable<typeof idem>['tx'], PoolConnection | undefined>>(true);
    await idem!.tx!.query('INSERT INTO orders (item) VALUES (?)', ['book']);
    res.end();
  },
);
