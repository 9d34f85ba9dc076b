// Orders through Knex, each keyed POST in atomic mode: the key, the order and the saved answer
// commit in one Knex transaction, the handler's `idem.tx`, or not at all.
//   DATABASE_URL=postgres://postgres@127.0.0.1:5432/shop PORT=3000 node examples/orm/knex/app.js
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import Knex from 'knex';
import { knexStore } from 'retrysafe/knex';
import { idempotency } from 'retrysafe/node';

const knex = Knex({ client: 'pg', connection: process.env.DATABASE_URL });
if (!(await knex.schema.hasTable('knex_orders'))) {
  await knex.schema
    .createTable('knex_orders', (table) => {
      table.increments('id');
      table.text('item').notNullable();
    })
    // Two apps starting at once: the second one's CREATE finds the table made.
    .catch(async (error) => {
      if (!(await knex.schema.hasTable('knex_orders'))) throw error;
    });
}
// retrysafe's table sits beside the app's (a name of its own); `migrate: true` creates it if missing.
const store = knexStore(knex, { table: 'knex_idempotency_keys', migrate: true });
const guard = idempotency({ store, mode: 'atomic' });

/**
 * Takes the order on `trx`, a Knex transaction. A few items misbehave on purpose, to show that
 * nothing of a failed operation is kept.
 */
async function takeOrder(trx, item) {
  const insert = async (on) => (await on('knex_orders').insert({ item }).returning(['id', 'item']))[0];
  switch (item) {
    case 'fail-after-write':
      await insert(trx);
      throw new Error('failed after writing the order');
    case 'nested-then-fail':
      // Knex's nested transaction: a savepoint, released (committed into the outer transaction).
      await trx.transaction((nested) => insert(nested));
      throw new Error('failed after the nested transaction');
    case 'raw-commit':
      // Ends the operation's transaction under retrysafe: it notices, and answers 500.
      await trx.raw('COMMIT');
      return insert(trx);
    case 'slow': {
      const order = await insert(trx);
      await sleep(3000);
      return order;
    }
    default:
      return insert(trx);
  }
}

const json = (res, status, body) =>
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));

const server = http.createServer(
  guard(async (req, res, idem) => {
    if (req.url !== '/orders') return json(res, 404, { error: 'not found' });
    if (req.method === 'GET')
      return json(res, 200, await knex('knex_orders').select('id', 'item').orderBy('id'));
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
      json(res, 201, await knex.transaction((trx) => takeOrder(trx, item)));
    } catch (error) {
      json(res, 500, { error: error.message });
    }
  }),
);
const port = Number(process.env.PORT ?? 3000);
server.listen(port, '127.0.0.1', () => console.log(`knex orders listening on http://127.0.0.1:${port}`));
