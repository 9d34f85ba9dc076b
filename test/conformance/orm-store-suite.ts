import pg from 'pg';
import { PG_URL, uniqueName } from '../support/services.js';
import { type DatabaseUnderTest, describeOrmConformance, type OrmUnderTest } from './orm-suite.js';
import { describeSqlDriverConformance } from './sql-driver-suite.js';

export type { OrmUnderTest } from './orm-suite.js';

/** The test PostgreSQL: each place is a schema of its own. */
const postgres: DatabaseUnderTest = {
  suffix: '',
  migrateUpFront: true,
  async fresh() {
    const schema = uniqueName('rs_orm');
    const admin = new pg.Pool({ connectionString: PG_URL, max: 2 });
    const table = (name: string) => `"${schema}".${name}`;
    return {
      url: PG_URL,
      options: { schema },
      missing: { schema: `${schema}_none` },
      table,
      async createTable(name) {
        await admin.query(`CREATE TABLE ${table(name)} (id serial PRIMARY KEY)`);
      },
      async count(name) {
        return Number((await admin.query(`SELECT count(*) FROM ${table(name)}`)).rows[0].count);
      },
      async drop() {
        await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
        await admin.end();
      },
    };
  },
};

/**
 * An ORM binding's whole check on PostgreSQL: its driver against the seam, then the ORM
 * conformance suite (`describeOrmConformance`). `open` makes a fresh ORM instance each time it is
 * called.
 */
export function describeOrmStore<Tx>(
  name: string,
  open: () => Promise<OrmUnderTest<Tx>>,
  quirks: { selectCountsRows?: boolean } = {},
): void {
  describeSqlDriverConformance<Tx>(name, async () => {
    const orm = await open();
    return { driver: orm.store({}).driver, nested: orm.nested, close: orm.close, ...quirks };
  });
  describeOrmConformance(name, postgres, open);
}
