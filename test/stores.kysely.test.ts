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
import { describe, expect, it } from 'vitest';
import { type KyselyTx, kyselyDriver, kyselyStore } from '../src/stores/sql/drivers/kysely.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { kyselyNested } from './support/kysely.js';
import { hasPostgres, PG_URL } from './support/services.js';

describe.skipIf(!hasPostgres)('kysely', () => {
  describeOrmStore<KyselyTx<any>>('kysely', async () => {
    const db = new Kysely<any>({
      dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: 10 }) }),
    });
    return {
      store: (options) => kyselyStore(db, options),
      insert: (tx, table) => sql`INSERT INTO ${sql.raw(table)} DEFAULT VALUES`.execute(tx),
      // Kysely nests with a savepoint on its controlled transaction.
      nested: kyselyNested,
      rawCommit: (tx) => sql`COMMIT`.execute(tx),
      end: { commit: (tx) => tx.commit().execute(), rollback: (tx) => tx.rollback().execute() },
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
