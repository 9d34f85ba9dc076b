import { AsyncLocalStorage } from 'node:async_hooks';

/** The turns of each single-connection client's statements and transactions, shared by its stores. */
const turns = new WeakMap<object, { tail: Promise<unknown>; inside: AsyncLocalStorage<true> }>();

/**
 * Runs a driver's calls on `client` one at a time, for ORMs that run every SQLite statement of
 * one client on a single connection without queueing transactions (TypeORM, Prisma's
 * better-sqlite3 adapter) or that open a connection per transaction, each one contending for
 * SQLite's one writer (Sequelize): an autocommit statement would otherwise join an open
 * transaction, or a second transaction fail busy. A call made inside a turn (within a
 * transaction's work) runs at once, in that transaction.
 */
export function oneAtATime(client: object): <T>(fn: () => Promise<T>) => Promise<T> {
  const turn = turns.get(client) ?? { tail: Promise.resolve(), inside: new AsyncLocalStorage<true>() };
  turns.set(client, turn);
  const { inside } = turn;
  return <T>(fn: () => Promise<T>): Promise<T> => {
    if (inside.getStore()) return fn();
    const result = turn.tail.then(() => inside.run(true, fn));
    turn.tail = result.catch(() => {});
    return result;
  };
}
