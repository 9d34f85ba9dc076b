import { handleOrder } from './orders.js';

const port = Number(Deno.env.get('PORT') ?? 3000);
Deno.serve({ port, hostname: Deno.env.get('HOST') ?? '127.0.0.1', onListen: () => {} }, (request) =>
  new URL(request.url).pathname === '/orders' && request.method === 'POST'
    ? handleOrder(request)
    : new Response('not found', { status: 404 }),
);
console.log(`listening on http://localhost:${port}`);
