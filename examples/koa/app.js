import { bodyParser } from '@koa/bodyparser';
import Koa from 'koa';
import { idempotency } from 'retrysafe/koa';
import { sqliteStore } from 'retrysafe/sqlite';

const app = new Koa();
let orders = 0;

// Errors answer JSON: ctx.throw's, and the body parser's 400 for a body that is not JSON.
app.use(async (ctx, next) => {
  try {
    await next();
  } catch (error) {
    if (!(error instanceof Koa.HttpError && error.expose)) throw error;
    ctx.status = error.status;
    ctx.body = { error: error.message };
  }
});
app.use(bodyParser({ onError: (error, ctx) => ctx.throw(error) }));
app.use(idempotency({ store: sqliteStore({ url: 'idempotency.db', migrate: true }), required: true }));
app.use((ctx) => {
  if (ctx.method !== 'POST' || ctx.path !== '/orders') return;
  const order = ctx.request.body;
  if (!(order instanceof Object && 'item' in order && typeof order.item === 'string'))
    ctx.throw(400, 'send a JSON order with an item');
  const id = ++orders;
  ctx.status = 201;
  ctx.set('location', `/orders/${id}`);
  ctx.body = { id, order, key: ctx.state.idempotency?.key };
});

const port = Number(process.env.PORT ?? 3000);
app.listen(port, process.env.HOST ?? '127.0.0.1', () => console.log(`listening on http://localhost:${port}`));
