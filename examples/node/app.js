import http from 'node:http';
import { idempotency } from 'retrysafe/node';
import { sqliteStore } from 'retrysafe/sqlite';

const guard = idempotency({ store: sqliteStore({ url: 'idempotency.db', migrate: true }), required: true });
let orders = 0;

const server = http.createServer(
  guard((req, res, idem) => {
    if (req.method !== 'POST' || req.url !== '/orders') return res.writeHead(404).end();
    let order;
    try {
      order = JSON.parse(String(req.body));
    } catch {}
    if (typeof order?.item !== 'string') {
      res.writeHead(400, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ error: 'send a JSON order with an item' }));
    }
    const id = ++orders;
    res.writeHead(201, { 'content-type': 'application/json', location: `/orders/${id}` });
    res.end(JSON.stringify({ id, order, key: idem?.key }));
  }),
);
const port = Number(process.env.PORT ?? 3000);
server.listen(port, process.env.HOST ?? '127.0.0.1', () =>
  console.log(`listening on http://localhost:${port}`),
);
