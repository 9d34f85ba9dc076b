import { handleOrder } from './orders.js';

const port = Number(process.env.PORT ?? 3000);
Bun.serve({
  port,
  hostname: process.env.HOST ?? '127.0.0.1',
  routes: { '/orders': { POST: handleOrder } },
});
console.log(`listening on http://localhost:${port}`);
