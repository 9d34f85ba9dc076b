import knexFactory, { type Knex } from 'knex';
import { describe, expect, it } from 'vitest';
import { knexDriver, knexStore } from '../src/stores/sql/drivers/knex.js';
import { knexPlaceholders } from '../src/stores/sql/drivers/knex-placeholders.js';
import { describeOrmStore } from './conformance/orm-store-suite.js';
import { hasPostgres, PG_URL } from './support/services.js';

describe('knexPlaceholders', () => {
  it('binds each $n where it stands, a repeated one twice, and escapes the ? already in the text', () => {
    expect(knexPlaceholders(`SELECT $2, $1, $2, x ? 'k', '?? $1', "a?b" FROM t`, ['one', 'two'])).toEqual({
      sql: `SELECT ?, ?, ?, x \\? 'k', '\\?\\? $1', "a\\?b" FROM t`,
      bindings: ['two', 'one', 'two'],
    });
    expect(knexPlaceholders(`SELECT 'it''s $1', $1`, [7])).toEqual({
      sql: `SELECT 'it''s $1', ?`,
      bindings: [7],
    });
  });

  it('leaves a $n or ? in a comment or a dollar-quoted body as text, whatever quotes they hold', () => {
    expect(knexPlaceholders(`SELECT $1 -- the record's ? $1\n, $2 /* it's $2? */`, ['a', 'b'])).toEqual({
      sql: `SELECT ? -- the record's \\? $1\n, ? /* it's $2\\? */`,
      bindings: ['a', 'b'],
    });
    expect(
      knexPlaceholders(`DO $$ BEGIN RAISE NOTICE 'a? $1'; END $$; SELECT $1, $tag$ $1 ? $tag$`, [1]),
    ).toEqual({
      sql: `DO $$ BEGIN RAISE NOTICE 'a\\? $1'; END $$; SELECT ?, $tag$ $1 \\? $tag$`,
      bindings: [1],
    });
  });

  it('refuses a $n past the values given', () => {
    expect(() => knexPlaceholders('SELECT $2', ['one'])).toThrow(RangeError);
  });
});

describe.skipIf(!hasPostgres)('knex', () => {
  describeOrmStore<Knex.Transaction>('knex', async () => {
    const knex = knexFactory({ client: 'pg', connection: PG_URL, pool: { min: 0, max: 10 } });
    return {
      store: (options) => knexStore(knex, options),
      insert: (tx, table) => tx.raw(`INSERT INTO ${table} DEFAULT VALUES`),
      // Knex nests a transaction on a transaction as a savepoint.
      nested: (tx, work) => tx.transaction((inner) => work(inner)),
      rawCommit: (tx) => tx.raw('COMMIT'),
      end: { commit: (tx) => tx.commit(), rollback: (tx) => tx.rollback() },
      close: () => knex.destroy(),
    };
  });

  it('refuses a Knex on a client it does not speak to, naming it', () => {
    const mssql = { client: { driverName: 'mssql' } } as unknown as Knex;
    expect(() => knexDriver(mssql)).toThrow(/runs on mssql/);
  });
});
