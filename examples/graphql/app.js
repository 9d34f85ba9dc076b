import { createServer } from 'node:http';
import { createSchema, createYoga } from 'graphql-yoga';
import { idempotentDirective, useIdempotency } from 'retrysafe/graphql';
import { sqliteStore } from 'retrysafe/sqlite';

const orders = [];
const schema = createSchema({
  typeDefs: /* GraphQL */ `
    ${idempotentDirective}
    type Order { id: Int! item: String! }
    type Query { orders: [Order!]! }
    type Mutation { createOrder(item: String!): Order! }
  `,
  resolvers: {
    Query: { orders: () => orders },
    Mutation: {
      createOrder: (_, { item }) => {
        const order = { id: orders.length + 1, item };
        orders.push(order);
        return order;
      },
    },
  },
});

// The key: the Idempotency-Key header, or `createOrder(item: "book") @idempotent(key: "…")`.
const yoga = createYoga({
  schema,
  plugins: [
    useIdempotency({
      store: sqliteStore({ url: 'idempotency.db', migrate: true }),
      mutations: ['createOrder'],
    }),
  ],
});
const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/orders') {
    res.setHeader('content-type', 'application/json');
    return res.end(JSON.stringify(orders));
  }
  return yoga(req, res);
});
const port = Number(process.env.PORT ?? 3000);
server.listen(port, process.env.HOST ?? '127.0.0.1', () =>
  console.log(`listening on http://localhost:${port}`),
);
