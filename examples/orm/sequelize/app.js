// Orders through Sequelize, each keyed POST in atomic mode: the key, the order and the saved answer
// commit in one Sequelize transaction, the handler's `idem.tx`, or not at all.
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/shop PORT=3000 node examples/orm/sequelize/app.js
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { idempotency } from 'retrysafe/node';
import { sequelizeStore } from 'retrysafe/sequelize';
import { DataTypes, Sequelize } from 'sequelize';

const sequelize = new Sequelize(process.env.DATABASE_URL, { logging: false });
const Order = sequelize.define(
  'Order',
  { item: { type: DataTypes.TEXT, allowNull: false } },
  { tableName: 'sequelize_orders', timestamps: false },
);
// CREATE TABLE IF NOT EXISTS; two apps starting at once: the second one's finds the table made.
await Order.sync().catch(async (error) => {
  if (!(await sequelize.getQueryInterface().tableExists('sequelize_orders'))) throw error;
});
// retrysafe's table sits beside the app's (a name of its own); `migrate: true` creates it if missing.
const store = sequelizeStore(sequelize, { table: 'sequelize_idempotency_keys', migrate: true });
const guard = idempotency({ store, mode: 'atomic' });

/**
 * Takes the order in `transaction`, a Sequelize transaction. A few items misbehave on purpose, to
 * show that nothing of a failed operation is kept.
 */
async function takeOrder(transaction, item) {
  const insert = async (on) => {
    const { id } = await Order.create({ item }, { transaction: on });
    return { id, item };
  };
  switch (item) {
    case 'fail-after-write':
      await insert(transaction);
      throw new Error('failed after writing the order');
    case 'nested-then-fail':
      // Sequelize's nested transaction: a savepoint, released (committed into the outer transaction).
      await sequelize.transaction({ transaction }, (nested) => insert(nested));
      throw new Error('failed after the nested transaction');
    case 'raw-commit':
      // Ends the operation's transaction under retrysafe: it notices, and answers 500.
      await sequelize.query('COMMIT', { transaction });
      return insert(transaction);
    case 'slow': {
      const order = await insert(transaction);
      await sleep(3000);
      return order;
    }
    default:
      return insert(transaction);
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
        await Order.findAll({ attributes: ['id', 'item'], order: [['id', 'ASC']], raw: true }),
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
      json(res, 201, await sequelize.transaction((transaction) => takeOrder(transaction, item)));
    } catch (error) {
      json(res, 500, { error: error.message });
    }
  }),
);
const port = Number(process.env.PORT ?? 3000);
server.listen(port, '127.0.0.1', () => console.log(`sequelize orders listening on http://127.0.0.1:${port}`));
