// Orders written through Prisma 7, on the transaction retrysafe opens for each keyed request:
// the order, the key and the saved answer commit together or not at all.
// DATABASE_URL=postgres://… PORT=3000 node examples/orm/prisma/app.js
import fs from 'node:fs';
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { PrismaPg } from '@prisma/adapter-pg';
import { idempotency } from 'retrysafe/node';
import { prismaStore } from 'retrysafe/prisma';

// The generated client (`npm run build` makes it); generated here on a checkout that was not built.
const client = new URL('./generated/client.js', import.meta.url);
if (!fs.existsSync(client)) await import('./generate.js');
const { PrismaClient } = await import(client.href);

const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: process.env.DATABASE_URL }) });
// `prisma migrate` and `prisma db push` need Prisma's schema engine binary, a download: the app
// creates its table itself, as schema.prisma maps it.
await prisma.$executeRawUnsafe(
  'CREATE TABLE IF NOT EXISTS prisma_orders (id serial PRIMARY KEY, item text NOT NULL)',
);

// retrysafe's records go in a table of their own, created on first use.
const store = prismaStore(prisma, { table: 'prisma_idempotency_keys', migrate: true });
const guard = idempotency({ store, mode: 'atomic' });

/** Writes the order on `tx`; the test items fail, end the transaction or take their time in it. */
async function placeOrder(tx, item) {
  if (item === 'nested-then-fail') {
    // Prisma's nested interactive transaction: a savepoint, released into the outer transaction.
    await tx.$transaction((nested) => nested.order.create({ data: { item } }));
    throw new Error('failed after the nested transaction');
  }
  // Ends the operation's transaction under retrysafe: it notices, and answers 500.
  if (item === 'raw-commit') await tx.$executeRawUnsafe('COMMIT');
  const order = await tx.order.create({ data: { item } });
  if (item === 'fail-after-write') throw new Error('the order failed after it was written');
  if (item === 'slow') await sleep(3000);
  return { id: order.id, item: order.item };
}

function send(res, status, body) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

const createOrder = guard(async (req, res, idem) => {
  let item;
  try {
    item = JSON.parse(String(req.body)).item;
  } catch {}
  if (typeof item !== 'string') return send(res, 400, { error: 'send a JSON order with an item' });
  // With a key, `idem.tx` is Prisma's interactive transaction client that also holds the key;
  // without one, the order gets a transaction of its own.
  const order = await (idem ? placeOrder(idem.tx, item) : prisma.$transaction((tx) => placeOrder(tx, item)));
  send(res, 201, order);
});

async function listOrders(res) {
  try {
    send(res, 200, await prisma.order.findMany({ orderBy: { id: 'asc' } }));
  } catch (error) {
    console.error(error);
    send(res, 500, { error: 'could not list the orders' });
  }
}

const server = http.createServer((req, res) => {
  if (req.url !== '/orders') return send(res, 404, { error: 'not found' });
  if (req.method === 'POST') return createOrder(req, res);
  if (req.method === 'GET') return listOrders(res);
  send(res, 405, { error: 'method not allowed' });
});
const port = Number(process.env.PORT ?? 3000);
server.listen(port, process.env.HOST ?? '127.0.0.1', () =>
  console.log(`listening on http://localhost:${port}`),
);
