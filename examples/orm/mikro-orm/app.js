// Orders through MikroORM, each keyed POST in atomic mode: the key, the order and the saved answer
// commit in one MikroORM transaction, whose EntityManager is the handler's `idem.tx`, or not at all.
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/shop PORT=3000 node examples/orm/mikro-orm/app.js
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { EntitySchema, MikroORM } from '@mikro-orm/postgresql';
import { mikroOrmStore } from 'retrysafe/mikro-orm';
import { idempotency } from 'retrysafe/node';

// An entity without decorators, so this file runs as plain JavaScript.
const Order = new EntitySchema({
  name: 'Order',
  tableName: 'mikro_orm_orders',
  properties: {
    id: { type: 'number', primary: true },
    item: { type: 'string', columnType: 'text' },
  },
});
const orm = await MikroORM.init({ clientUrl: process.env.DATABASE_URL, entities: [Order] });
await orm.em
  .getConnection()
  .execute('CREATE TABLE IF NOT EXISTS mikro_orm_orders (id serial PRIMARY KEY, item text NOT NULL)');
// retrysafe's table sits beside the app's (a name of its own); `migrate: true` creates it if missing.
const store = mikroOrmStore(orm, { table: 'mikro_orm_idempotency_keys', migrate: true });
const guard = idempotency({ store, mode: 'atomic' });

/**
 * Takes the order on `em`, the EntityManager of a MikroORM transaction. A few items misbehave on
 * purpose, to show that nothing of a failed operation is kept.
 */
async function takeOrder(em, item) {
  const insert = async (on) => {
    const order = on.create(Order, { item });
    await on.flush();
    return { id: order.id, item: order.item };
  };
  switch (item) {
    case 'fail-after-write':
      await insert(em);
      throw new Error('failed after writing the order');
    case 'nested-then-fail':
      // MikroORM's nested transaction: a savepoint, released (committed into the outer transaction).
      await em.transactional((nested) => insert(nested));
      throw new Error('failed after the nested transaction');
    case 'raw-commit':
      // Ends the operation's transaction under retrysafe: it notices, and answers 500.
      await em.getConnection().execute('COMMIT', [], 'run', em.getTransactionContext());
      return insert(em);
    case 'slow': {
      const order = await insert(em);
      await sleep(3000);
      return order;
    }
    default:
      return insert(em);
  }
}

const json = (res, status, body) =>
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));

const server = http.createServer(
  guard(async (req, res, idem) => {
    if (req.url !== '/orders') return json(res, 404, { error: 'not found' });
    if (req.method === 'GET') {
      const orders = await orm.em.fork().find(Order, {}, { orderBy: { id: 'ASC' } });
      return json(
        res,
        200,
        orders.map(({ id, item }) => ({ id, item })),
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
    // A POST without an Idempotency-Key is no operation: its order gets a transaction of its own.
    try {
      json(res, 201, await orm.em.transactional((em) => takeOrder(em, item)));
    } catch (error) {
      json(res, 500, { error: error.message });
    }
  }),
);
const port = Number(process.env.PORT ?? 3000);
server.listen(port, '127.0.0.1', () => console.log(`mikro-orm orders listening on http://127.0.0.1:${port}`));
