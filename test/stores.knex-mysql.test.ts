import knexFactory, { type Knex } from 'knex';
import { describe } from 'vitest';
import { knexStore } from '../src/stores/sql/drivers/knex.js';
import { describeMysqlOrmStore } from './conformance/orm-mysql-suite.js';
import { hasMysql } from './support/services.js';

describe.skipIf(!hasMysql)('knex on MariaDB', () => {
  describeMysqlOrmStore<Knex.Transaction>('knex', async (url) => {
    const knex = knexFactory({ client: 'mysql2', connection: url, pool: { min: 0, max: 10 } });
    return {
      store: (options) => knexStore(knex, options),
      insert: (tx, table) => tx(table).insert({}),
      nested: (tx, work) => tx.transaction((inner) => work(inner)),
      end: { commit: (tx) => tx.commit(), rollback: (tx) => tx.rollback() },
      rawCommit: (tx) => tx.raw('COMMIT'),
      close: () => knex.destroy(),
    };
  });
});
