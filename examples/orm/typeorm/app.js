// Orders through TypeORM, each keyed POST in atomic mode: the key, the order and the saved answer
// commit in one TypeORM transaction, whose EntityManager is the handler's `idem.tx`, or not at all.
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/shop PORT=3000 node examples/orm/typeorm/app.js
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { idempotency } from 'retrysafe/node';
import { typeormStore } from 'retrysafe/typeorm';
import { DataSource, EntitySchema } from 'typeorm';

// An entity without decorators, so this file runs as plain JavaScript.
const Order = new EntitySchema({
  name: 'Order',
  tableName: 'typeorm_orders',
  columns: {
    id: { type: Number, primary: true, generated: true },
    item: { type: String },
  },
});
const dataSource = await new DataSource({
  type: 'postgres',
  url: process.env.DATABASE_URL,
  entities: [Order],
}).initialize();
await dataSource.query(
  'CREATE TABLE IF NOT EXISTS typeorm_orders (id serial PRIMARY KEY, item text NOT NULL)',
);
// retrysafe's table sits beside the app's (a name of its own); `migrate: true` creates it if missing.
const store = typeormStore(dataSource, { table: 'typeorm_idempotency_keys', migrate: true });
const guard = idempotency({ store, mode: 'atomic' });

/**
 * Takes the order on `manager`, a TypeORM transaction's EntityManager. A few items misbehave on
 * purpose, to show that nothing of a failed operation is kept.
 */
async function takeOrder(manager, item) {
  const insert = async (on) => {
    const { id } = await on.getRepository(Order).save({ item });
    return { id, item };
  };
  switch (item) {
    case 'fail-after-write':
      await insert(manager);
      throw new Error('failed after writing the order');
    case 'nested-then-fail':
      // TypeORM's nested transaction: a savepoint, released (committed into the outer transaction).
      await manager.transaction((nested) => insert(nested));
      throw new Error('failed after the nested transaction');
    case 'raw-commit':
      // Ends the operation's transaction under retrysafe: it notices, and answers 500.
      await manager.query('COMMIT');
      return insert(manager);
    case 'slow': {
      const order = await insert(manager);
      await sleep(3000);
      return order;
    }
    default:
      return insert(manager);
  }
}

const json = (res, status, body) =>
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));

const server = http.createServer(
  guard(async (req, res, idem) => {
    if (req.url !== '/orders') return json(res, 404, { error: 'not found' });
    if (req.method === 'GET') {
      return json(res, 200, await dataSource.getRepository(Order).find({ order: { id: 'ASC' } }));
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
      json(res, 201, await dataSource.transaction((manager) => takeOrder(manager, item)));
    } catch (error) {
      json(res, 500, { error: error.message });
    }
  }),
);
const port = Number(process.env.PORT ?? 3000);
server.listen(port, '127.0.0.1', () => console.log(`typeorm orders listening on http://127.0.0.1:${port}`));
