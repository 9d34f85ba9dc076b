import express from 'express';
import { idempotency } from 'retrysafe/express';
import { sqliteStore } from 'retrysafe/sqlite';

const app = express();
const json = express.json();
// express.json() answers a body that is not JSON with an HTML page: answer JSON instead.
app.use((req, res, next) =>
  json(req, res, (error) => (error ? res.status(error.status).json({ error: error.message }) : next())),
);
const store = sqliteStore({ url: 'idempotency.db', migrate: true });
let orders = 0;

app.post('/orders', idempotency({ store, required: true }), (req, res) => {
  if (typeof req.body?.item !== 'string')
    return res.status(400).json({ error: 'send a JSON order with an item' });
  const id = ++orders;
  res.status(201).location(`/orders/${id}`).json({ id, order: req.body, key: req.idempotency?.key });
});

const port = Number(process.env.PORT ?? 3000);
app.listen(port, process.env.HOST ?? '127.0.0.1', () => console.log(`listening on http://localhost:${port}`));
