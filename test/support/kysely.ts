import type { KyselyTx } from '../../src/stores/sql/drivers/kysely.js';

/**
 * Runs `work` in Kysely's nested transaction on `tx`: a savepoint, released when `work` resolves,
 * rolled back to (and the throw passed on) when it throws.
 */
export async function kyselyNested(tx: KyselyTx<any>, work: (inner: KyselyTx<any>) => Promise<void>) {
  const inner = await tx.savepoint('nested').execute();
  try {
    await work(inner);
  } catch (error) {
    await inner.rollbackToSavepoint('nested').execute();
    throw error;
  }
  await inner.releaseSavepoint('nested').execute();
}
