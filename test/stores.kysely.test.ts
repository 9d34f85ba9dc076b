import {
  DummyDriver,
  Kysely,
  PostgresAdapter,
  PostgresDialect,
  PostgresIntrospector,
  PostgresQueryCompiler,
  SqliteAdapter,
  sql,
} from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isTransactionEnded } from '../src/core/contract/index.js';
import { type KyselyTx, kyselyDriver, kyselyStore } from '../src/stores/sql/drivers/kysely.js';
import type { SqlStore } from '../src/stores/sql/store.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';
import { claimInput, textResponse } from './support/store-calls.js';

describe.skipIf(!hasPostgres)('kysely', () => {
  describeOrmStore<KyselyTx<any>>('kysely', async () => {
    const db = new Kysely<any>({
      dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: 10 }) }),
    });
    return {
      store: (options) => kyselyStore(db, options),
      insert: (tx, table) => sql`INSERT INTO ${sql.raw(table)} DEFAULT VALUES`.execute(tx),
      // Kysely nests with a savepoint on its controlled transaction.
      async nested(tx, work) {
        const inner = await tx.savepoint('nested').execute();
        try {
          await work(inner);
        } catch (error) {
          await inner.rollbackToSavepoint('nested').execute();
          throw error;
        }
        await inner.releaseSavepoint('nested').execute();
      },
      rawCommit: (tx) => sql`COMMIT`.execute(tx),
      close: () => db.destroy(),
    };
  });
});

describe('kyselyDriver: the dialect', () => {
  const withAdapter = (adapter: object) =>
    new Kysely<any>({
      dialect: {
        createAdapter: () => adapter as PostgresAdapter,
        createDriver: () => new DummyDriver(),
        createIntrospector: (db) => new PostgresIntrospector(db),
        createQueryCompiler: () => new PostgresQueryCompiler(),
      },
    });

  it("is known by Kysely's adapter, one extending it, or one of another copy of Kysely", () => {
    expect(kyselyDriver(withAdapter(new PostgresAdapter())).dialect).toBe('postgres');
    expect(kyselyDriver(withAdapter(new (class Pglite extends PostgresAdapter {})())).dialect).toBe(
      'postgres',
    );
    expect(kyselyDriver(withAdapter(new SqliteAdapter())).dialect).toBe('sqlite');
    // Another copy's class of that name.
    const copy = { MysqlAdapter: class MysqlAdapter {} };
    expect(kyselyDriver(withAdapter(new copy.MysqlAdapter())).dialect).toBe('mysql');
  });

  it('refuses any other adapter, naming it', () => {
    expect(() => kyselyDriver(withAdapter(new (class MssqlAdapter {})()))).toThrow(
      /adapter \(MssqlAdapter\)/,
    );
  });
});

describe.skipIf(!hasPostgres)("kysely: a handler that ends Kysely's transaction itself", () => {
  const schema = uniqueName('rs_kysely_end');
  const orders = `"${schema}".orders`;
  let db: Kysely<any>;
  let store: SqlStore<KyselyTx<any>>;
  const rows = async () =>
    Number((await sql<{ n: string }>`SELECT count(*) AS n FROM ${sql.raw(orders)}`.execute(db)).rows[0]!.n);

  beforeAll(async () => {
    db = new Kysely<any>({
      dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: 4 }) }),
    });
    store = kyselyStore(db, { schema, migrate: true });
    await store.migrate();
    await sql`CREATE TABLE ${sql.raw(orders)} (id serial PRIMARY KEY)`.execute(db);
  });
  afterAll(async () => {
    await store?.close();
    await sql`DROP SCHEMA IF EXISTS ${sql.raw(`"${schema}"`)} CASCADE`.execute(db);
    await db?.destroy();
  });

  const ending = (how: 'commit' | 'rollback', counter: { runs: number }) => async (tx: KyselyTx<any>) => {
    counter.runs++;
    await sql`INSERT INTO ${sql.raw(orders)} DEFAULT VALUES`.execute(tx);
    await tx[how]().execute();
    return { response: textResponse('ok'), commit: true };
  };

  it('tx.commit(): caught as a raw COMMIT is, and the key keeps a 500 so the write never runs again', async () => {
    const before = await rows();
    const input = claimInput('kysely-commit');
    const counter = { runs: 0 };
    const failure = await store.atomic(input, ending('commit', counter)).catch((error: unknown) => error);
    expect(isTransactionEnded(failure)).toBe(true);
    expect(await rows()).toBe(before + 1);
    expect(await store.atomic(input, ending('commit', counter))).toMatchObject({
      outcome: 'replay',
      response: { status: 500 },
    });
    expect(counter.runs).toBe(1);
    expect(await rows()).toBe(before + 1);
  });

  it('tx.rollback(): caught too; nothing is kept, so the key is free for a retry', async () => {
    const before = await rows();
    const input = claimInput('kysely-rollback');
    const counter = { runs: 0 };
    const failure = await store.atomic(input, ending('rollback', counter)).catch((error: unknown) => error);
    expect(isTransactionEnded(failure)).toBe(true);
    expect(await rows()).toBe(before);
    expect(await store.get(input.scope, input.key)).toBeUndefined();
  });
});
