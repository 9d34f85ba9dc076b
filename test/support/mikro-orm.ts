/**
 * A MikroORM 6 instance of no entities, through the driver package's `MikroORM.init`: the tests
 * write with raw statements through the EntityManager.
 */
export const openMikroOrm = <O>(init: (options: object) => Promise<O>, clientUrl: string): Promise<O> =>
  init({ clientUrl, entities: [], discovery: { warnWhenNoEntities: false }, pool: { min: 0, max: 10 } });

/** A MikroORM EntityManager of a SQL driver, as far as `execute` needs it. */
interface SqlEm {
  getConnection(): { execute(sql: string, params: unknown[], method: 'run', ctx: unknown): Promise<unknown> };
  getTransactionContext(): unknown;
}

/** Runs raw `sql` through MikroORM on the transaction `tx` is in (a careless handler's `COMMIT`). */
export const executeIn = (tx: SqlEm, sql: string) =>
  tx.getConnection().execute(sql, [], 'run', tx.getTransactionContext());
