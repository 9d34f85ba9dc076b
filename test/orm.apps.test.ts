import { randomUUID } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  type AppDatabase,
  freshDatabase,
  type OrmApp,
  ormsWithApps,
  startOrmApp,
  waitFor,
} from './support/orm-app.js';
import { hasPostgres } from './support/services.js';

// Issue 31's promises, held against each ORM's quick start (examples/orm/<orm>/app.js) as a child
// process on a PostgreSQL database of its own. The items the apps know: "fail-after-write" writes
// its row, then throws; "slow" writes its row, then waits 3 s; "nested-then-fail" writes its row in
// the ORM's own nested transaction (a savepoint), which commits, then throws; "raw-commit" sends a
// raw COMMIT on the operation's transaction, writes its row, and answers 201.

const newKey = () => `orm-${randomUUID()}`;

describe.skipIf(!hasPostgres)('ORM quick starts (examples/orm/<orm>/app.js) on PostgreSQL', () => {
  if (ormsWithApps.length === 0) it.skip('no examples/orm/<orm>/app.js in this checkout', () => {});

  describe.each(ormsWithApps)('%s', (orm) => {
    let database: AppDatabase;
    let app: OrmApp;
    beforeAll(async () => {
      database = await freshDatabase();
      app = await startOrmApp(orm, database.url);
    }, 120_000);
    afterAll(async () => {
      await app?.stop();
      await database?.drop();
    }, 60_000);
    // What the app printed explains a failure that its answers alone do not.
    afterEach((context) => {
      if (context.task.result?.state === 'fail') console.error(`${orm} app output:\n${app?.output()}`);
    });

    const rowsOf = async (item: string) => (await app.orders()).filter((order) => order.item === item).length;

    it('POST /orders answers 201 {id, item} and GET /orders lists it, with a key or without', async () => {
      const keyed = await app.order('keyed-book', newKey());
      expect(keyed.status).toBe(201);
      expect(keyed.body).toEqual({ id: expect.anything(), item: 'keyed-book' });
      const unkeyed = await app.order('unkeyed-book');
      expect(unkeyed.status).toBe(201);
      expect(unkeyed.body).toEqual({ id: expect.anything(), item: 'unkeyed-book' });
      const orders = await app.orders();
      expect(orders).toContainEqual(keyed.body);
      expect(orders).toContainEqual(unkeyed.body);
    });

    it('200 concurrent duplicates: one row, and 200 identical 201 answers', async () => {
      const key = newKey();
      const answers = await Promise.all(Array.from({ length: 200 }, () => app.order('duplicated', key)));
      expect(answers.map((answer) => answer.status)).toEqual(Array(200).fill(201));
      for (const answer of answers) expect(answer.body).toEqual(answers[0]!.body);
      expect(answers.filter((answer) => answer.headers.get('idempotency-replayed') === 'true')).toHaveLength(
        199,
      );
      expect(await rowsOf('duplicated')).toBe(1);
    }, 120_000);

    it('fail-after-write: 500 and no row; the key is free again for a retry and for another body', async () => {
      const key = newKey();
      const failed = await app.order('fail-after-write', key);
      expect(failed.status).toBe(500);
      // Not a replay of a saved 500 and not an in-progress 409: the retry runs the handler again.
      const again = await app.order('fail-after-write', key);
      expect(again.status).toBe(500);
      expect(again.headers.get('idempotency-replayed')).toBeNull();
      expect(await rowsOf('fail-after-write')).toBe(0);
      // Nothing of the failed operation is left under the key: another body is no conflict.
      const other = await app.order('after-the-failure', key);
      expect(other.status).toBe(201);
      expect(await rowsOf('after-the-failure')).toBe(1);
    });

    it('the same key with another item: 409, and no row added', async () => {
      const key = newKey();
      expect((await app.order('first-item', key)).status).toBe(201);
      const before = (await app.orders()).length;
      const conflict = await app.order('second-item', key);
      expect(conflict.status).toBe(409);
      expect((await app.orders()).length).toBe(before);
      expect(await rowsOf('second-item')).toBe(0);
    });

    it("the ORM's own nested transaction commits its savepoint, then the handler throws: 500, no row", async () => {
      const key = newKey();
      expect((await app.order('nested-then-fail', key)).status).toBe(500);
      expect(await rowsOf('nested-then-fail')).toBe(0);
      // The savepoint did not end the operation's transaction: the key was released with it.
      expect((await app.order('nested-then-fail', key)).status).toBe(500);
      expect(await rowsOf('nested-then-fail')).toBe(0);
    });

    it('a raw COMMIT by the handler: a 5xx, and a retry replays it at once without writing again', async () => {
      const key = newKey();
      const ended = await app.order('raw-commit', key);
      expect(ended.status).toBeGreaterThanOrEqual(500);
      // The row written after the COMMIT ran outside any transaction: it may be kept, once.
      const kept = await rowsOf('raw-commit');
      expect(kept).toBeLessThanOrEqual(1);
      // The key is not left in progress (a retry would wait, then get a 409) nor free (it would
      // run the write again): the failure is kept and replayed.
      const retry = await app.order('raw-commit', key);
      expect(retry.status).toBe(ended.status);
      expect(retry.headers.get('idempotency-replayed')).toBe('true');
      expect(await rowsOf('raw-commit')).toBe(kept);
    });

    // Last: it restarts the app.
    it('SIGKILL while "slow" is inside its transaction: no row; after a restart the retry runs once', async () => {
      const key = newKey();
      const pending = app.order('slow', key).catch((error: unknown) => error);
      // The handler has written its row and sleeps: its connection idles inside the transaction.
      await waitFor('the slow order to be written inside its transaction', async () =>
        (await database.openTransactions()).some((query) => /insert\s+into\s[^(]*order/i.test(query)),
      );
      await app.kill9();
      expect(await pending).toBeInstanceOf(Error);
      // PostgreSQL ends the dead app's sessions, rolling back their transaction.
      await waitFor(
        'the killed app to have no connection left',
        async () => (await database.connections()) === 0,
      );
      app = await startOrmApp(orm, database.url);
      expect(await rowsOf('slow')).toBe(0);
      const retry = await app.order('slow', key);
      expect(retry.status).toBe(201);
      expect(retry.headers.get('idempotency-replayed')).toBeNull();
      const replay = await app.order('slow', key);
      expect(replay.status).toBe(201);
      expect(replay.headers.get('idempotency-replayed')).toBe('true');
      expect(replay.body).toEqual(retry.body);
      expect(await rowsOf('slow')).toBe(1);
    }, 240_000);
  });
});
