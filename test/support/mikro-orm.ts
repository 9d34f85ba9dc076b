/**
 * A MikroORM 6 instance of no entities, through the driver package's `MikroORM.init`: the tests
 * write with raw statements through the EntityManager.
 */
export const openMikroOrm = <O>(init: (options: object) => Promise<O>, clientUrl: string): Promise<O> =>
  init({ clientUrl, entities: [], discovery: { warnWhenNoEntities: false }, pool: { min: 0, max: 10 } });
