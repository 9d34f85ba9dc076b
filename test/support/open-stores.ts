import { afterEach } from 'vitest';
import type { IdempotencyStore } from '../../src/core/contract/index.js';

/** Registers an `afterEach` that closes every store handed to the returned function (which hands it back). */
export function closedAfterEach(): <S extends IdempotencyStore>(store: S) => S {
  const open: IdempotencyStore[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((store) => store.close()));
  });
  return (store) => {
    open.push(store);
    return store;
  };
}
