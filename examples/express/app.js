import express from 'express';
import { idempotency } from 'retrysafe/express';
import { sqliteStore } from 'retrysafe/sqlite';

const app = express();
app.use(express.json());
const store = sqliteStore({ filename: 'idempotency.db' });
let orders = 0;

app.post('/orders', idempotency({ store, required: true }), (req, res) => {
  const id = ++orders;
  res.status(201).location(`/orders/${id}`).json({ id, order: req.body, key: req.idempotency?.key });
});

const port = Number(process.env.PORT ?? 3000);
app.listen(port, process.env.HOST ?? '127.0.0.1', () => console.log(`listening on http://localhost:${port}`));
