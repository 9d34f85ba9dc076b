import knexFactory, { type Knex } from 'knex';
import { describe } from 'vitest';
import { knexStore } from '../src/stores/sql/drivers/knex.js';
import { describeSqliteOrmStore } from './conformance/orm-sqlite-suite.js';

describe('knex on SQLite (better-sqlite3)', () => {
  describeSqliteOrmStore<Knex.Transaction>(
    'knex',
    async (url) => {
      const knex = knexFactory({
        client: 'better-sqlite3',
        connection: { filename: url },
        useNullAsDefault: true,
      });
      return {
        store: (options) => knexStore(knex, options),
        insert: (tx, table) => tx(table).insert({}),
        nested: (tx, work) => tx.transaction((inner) => work(inner)),
        end: { commit: (tx) => tx.commit(), rollback: (tx) => tx.rollback() },
        rawCommit: (tx) => tx.raw('COMMIT'),
        close: () => knex.destroy(),
      };
    },
    (tx, sql) => tx.raw(sql),
  );
});
