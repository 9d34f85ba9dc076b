import { bodyParser } from '@koa/bodyparser';
import Koa from 'koa';
import { idempotency } from 'retrysafe/koa';
import { sqliteStore } from 'retrysafe/sqlite';

const app = new Koa();
let orders = 0;

app.use(bodyParser());
app.use(idempotency({ store: sqliteStore({ filename: 'idempotency.db' }), required: true }));
app.use((ctx) => {
  if (ctx.method !== 'POST' || ctx.path !== '/orders') return;
  const id = ++orders;
  ctx.status = 201;
  ctx.set('location', `/orders/${id}`);
  ctx.body = { id, order: ctx.request.body, key: ctx.state.idempotency?.key };
});

const port = Number(process.env.PORT ?? 3000);
app.listen(port, process.env.HOST ?? '127.0.0.1', () => console.log(`listening on http://localhost:${port}`));
