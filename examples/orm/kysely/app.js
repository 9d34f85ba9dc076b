// Orders through Kysely, each keyed POST in atomic mode: the key, the order and the saved answer
// commit in one Kysely transaction, the handler's `idem.tx`, or not at all.
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/shop PORT=3000 node examples/orm/kysely/app.js
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { kyselyStore } from 'retrysafe/kysely';
import { idempotency } from 'retrysafe/node';

const db = new Kysely({
  dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: process.env.DATABASE_URL }) }),
});
await db.schema
  .createTable('kysely_orders')
  .ifNotExists()
  .addColumn('id', 'serial', (column) => column.primaryKey())
  .addColumn('item', 'text', (column) => column.notNull())
  .execute();
// retrysafe's table sits beside the app's (a name of its own); `migrate: true` creates it if missing.
const store = kyselyStore(db, { table: 'kysely_idempotency_keys', migrate: true });
const guard = idempotency({ store, mode: 'atomic' });

/**
 * Takes the order on `tx`, a Kysely transaction. A few items misbehave on purpose, to show that
 * nothing of a failed operation is kept.
 */
async function takeOrder(tx, item) {
  const insert = (on) => on.insertInto('kysely_orders').values({ item }).returning(['id', 'item']);
  switch (item) {
    case 'fail-after-write':
      await insert(tx).execute();
      throw new Error('failed after writing the order');
    case 'nested-then-fail': {
      // Kysely's nested transaction: a savepoint, released (committed into the outer transaction).
      const nested = await tx.savepoint('nested').execute();
      await insert(nested).execute();
      await nested.releaseSavepoint('nested').execute();
      throw new Error('failed after the nested transaction');
    }
    case 'raw-commit':
      // Ends the operation's transaction under retrysafe: it notices, and answers 500.
      await sql`COMMIT`.execute(tx);
      return insert(tx).executeTakeFirstOrThrow();
    case 'slow': {
      const order = await insert(tx).executeTakeFirstOrThrow();
      await sleep(3000);
      return order;
    }
    default:
      return insert(tx).executeTakeFirstOrThrow();
  }
}

/** A POST without an Idempotency-Key is no operation: its order gets a transaction of its own. */
async function ownTransaction(work) {
  const tx = await db.startTransaction().execute();
  try {
    const result = await work(tx);
    await tx.commit().execute();
    return result;
  } catch (error) {
    await tx.rollback().execute();
    throw error;
  }
}

const json = (res, status, body) =>
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));

const server = http.createServer(
  guard(async (req, res, idem) => {
    if (req.url !== '/orders') return json(res, 404, { error: 'not found' });
    if (req.method === 'GET') {
      return json(
        res,
        200,
        await db.selectFrom('kysely_orders').select(['id', 'item']).orderBy('id').execute(),
      );
    }
    if (req.method !== 'POST') return json(res, 405, { error: 'GET or POST /orders' });
    let item;
    try {
      item = JSON.parse(String(req.body)).item;
    } catch {}
    if (typeof item !== 'string') return json(res, 400, { error: 'send a JSON order with an item' });
    if (idem) {
      // A throw here answers 500 and rolls the operation back, key and order together.
      return json(res, 201, await takeOrder(idem.tx, item));
    }
    try {
      json(res, 201, await ownTransaction((tx) => takeOrder(tx, item)));
    } catch (error) {
      json(res, 500, { error: error.message });
    }
  }),
);
const port = Number(process.env.PORT ?? 3000);
server.listen(port, '127.0.0.1', () => console.log(`kysely orders listening on http://127.0.0.1:${port}`));
