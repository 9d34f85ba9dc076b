import {
  DummyDriver,
  Kysely,
  MysqlDialect,
  SqliteAdapter,
  SqliteIntrospector,
  SqliteQueryCompiler,
  sql,
} from 'kysely';
import mysql from 'mysql2';
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../src/core/contract/index.js';
import type { SqlDriver } from '../src/stores/sql/driver.js';
import { type KyselyTx, kyselyStore } from '../src/stores/sql/drivers/kysely.js';
import { positional } from '../src/stores/sql/placeholders.js';
import { sqlStore } from '../src/stores/sql/store.js';
import { describeMysqlOrmStore } from './conformance/orm-mysql-suite.js';
import { kyselyNested } from './support/kysely.js';
import { hasMysql } from './support/services.js';

describe.skipIf(!hasMysql)('kysely on MariaDB', () => {
  describeMysqlOrmStore<KyselyTx<any>>('kysely', async (url) => {
    const db = new Kysely<any>({
      dialect: new MysqlDialect({ pool: mysql.createPool({ uri: url, connectionLimit: 10 }) }),
    });
    return {
      store: (options) => kyselyStore(db, options),
      insert: (tx, table) => sql`INSERT INTO ${sql.raw(table)} () VALUES ()`.execute(tx),
      // Kysely nests with a savepoint on its controlled transaction.
      nested: kyselyNested,
      end: { commit: (tx) => tx.commit().execute(), rollback: (tx) => tx.rollback().execute() },
      rawCommit: (tx) => sql`COMMIT`.execute(tx),
      close: () => db.destroy(),
    };
  });
});

describe('positional: the mysql store’s :name placeholders as ?', () => {
  it('binds each use of a name in order, and leaves quoted text and identifiers alone', () => {
    const text = "SELECT ':a', `x:a`, :a, 'it''s :b', :b, :a FROM t WHERE c = '00:00:00'";
    expect(positional(text, { a: 1, b: null })).toEqual({
      text: "SELECT ':a', `x:a`, ?, 'it''s :b', ?, ? FROM t WHERE c = '00:00:00'",
      params: [1, null, 1],
    });
  });

  it('refuses a name without a value', () => {
    expect(() => positional('SELECT :missing', {})).toThrow(/:missing/);
  });
});

describe('sqlStore: the dialects', () => {
  it('refuses a driver of a dialect it has no SQL for, naming it', () => {
    const driver = {
      ...kyselyStore(sqliteKysely()).driver,
      dialect: 'oracle',
    } as unknown as SqlDriver<unknown>;
    expect(() => sqlStore(driver)).toThrow(ConfigError);
    expect(() => sqlStore(driver)).toThrow(/no SQL dialect "oracle"/);
  });
});

/** A Kysely on SQLite that never connects. */
function sqliteKysely() {
  return new Kysely<any>({
    dialect: {
      createAdapter: () => new SqliteAdapter(),
      createDriver: () => new DummyDriver(),
      createIntrospector: (kysely) => new SqliteIntrospector(kysely),
      createQueryCompiler: () => new SqliteQueryCompiler(),
    },
  });
}
