import { sql } from 'drizzle-orm';
import { drizzle, type MySql2Database } from 'drizzle-orm/mysql2';
import mysql from 'mysql2/promise';
import { describe } from 'vitest';
import { type DrizzleTransaction, drizzleStore } from '../src/stores/sql/drivers/drizzle.js';
import { describeMysqlOrmStore } from './conformance/orm-mysql-suite.js';
import { hasMysql } from './support/services.js';

describe.skipIf(!hasMysql)('drizzle on MariaDB', () => {
  describeMysqlOrmStore<DrizzleTransaction<MySql2Database>>('drizzle', async (url) => {
    const pool = mysql.createPool({ uri: url, connectionLimit: 10 });
    const db: MySql2Database = drizzle(pool);
    return {
      store: (options) => drizzleStore(db, options),
      insert: (tx, table) => tx.execute(sql.raw(`INSERT INTO ${table} () VALUES ()`)),
      nested: (tx, work) => tx.transaction((inner) => work(inner)),
      rawCommit: (tx) => tx.execute(sql.raw('COMMIT')),
      close: () => pool.end(),
    };
  });
});
