import { DynamoDBClient, PutItemCommand, ScanCommand } from '@aws-sdk/client-dynamodb';
import { idempotent, isIdempotencyError } from 'retrysafe';
import { dynamodbStore } from 'retrysafe/dynamodb';

// An AWS Lambda function behind an API Gateway HTTP API or a function URL (payload 2.0):
// `POST /orders` with an `Idempotency-Key` header and `{"item": "book"}` makes one order per key,
// however often API Gateway, the client or a retrying SDK sends it, and however many execution
// environments run the duplicates at once; `GET /orders` lists every order.
//
// Tables: IDEMPOTENCY_TABLE (partition key `pk`, string; TTL on `ttl`: what `store.migrate()`
// creates, or your template declares) and ORDERS_TABLE (partition key `id`, string). The client
// and the store live outside the handler: one per execution environment, reused by its invocations.
const client = new DynamoDBClient({});
const store = dynamodbStore({ client, table: process.env.IDEMPOTENCY_TABLE ?? 'idempotency' });
const ORDERS_TABLE = process.env.ORDERS_TABLE ?? 'orders';

const createOrder = idempotent({
  store,
  scope: 'orders',
  key: (request) => request.key,
  // What must match for a duplicate to replay: another item under the same key is a conflict (409).
  fingerprint: (request) => request.item,
  // A concurrent duplicate waits for the first one's order (up to 10 s), within the function's timeout.
  wait: '10s',
});

const json = (statusCode, body, headers = {}) => ({
  statusCode,
  headers: { 'content-type': 'application/json', ...headers },
  body: JSON.stringify(body),
});

export async function handler(event) {
  const { method, path } = event.requestContext.http;
  if (path !== '/orders') return json(404, { error: 'not_found' });
  if (method === 'GET') return json(200, await allOrders());
  if (method !== 'POST') return json(405, { error: 'method_not_allowed' }, { allow: 'GET, POST' });

  // HTTP API lower-cases header names.
  const key = event.headers?.['idempotency-key'];
  if (!key) return json(400, { error: 'idempotency_key_missing' });
  const item = itemOf(event);
  if (item === undefined) return json(400, { error: 'body_invalid', message: 'expected {"item": "…"}' });

  try {
    const order = await createOrder({ key, item }, async (ctx) => {
      // Lease mode: the order's id derives from the key and the write is conditional, so a run
      // again after a crash past the lease finds the order it placed instead of placing another.
      const placed = { id: ctx.downstreamKey('order'), item };
      await client
        .send(
          new PutItemCommand({
            TableName: ORDERS_TABLE,
            Item: { id: { S: placed.id }, item: { S: item } },
            ConditionExpression: 'attribute_not_exists(id)',
          }),
        )
        .catch((error) => {
          if (error.name !== 'ConditionalCheckFailedException') throw error;
        });
      return placed;
    });
    return json(201, order, { location: `/orders/${order.id}` });
  } catch (error) {
    // key_conflict 409, request_in_progress 409 + retry-after, store_unavailable 503: as HTTP says.
    if (isIdempotencyError(error)) {
      return json(error.status, { error: error.code, message: error.message }, error.headers);
    }
    throw error;
  }
}

function itemOf(event) {
  try {
    const text = event.isBase64Encoded ? Buffer.from(event.body ?? '', 'base64').toString() : event.body;
    const { item } = JSON.parse(text ?? '');
    return typeof item === 'string' && item !== '' ? item : undefined;
  } catch {
    return undefined;
  }
}

async function allOrders() {
  const orders = [];
  let ExclusiveStartKey;
  do {
    const page = await client.send(
      new ScanCommand({ TableName: ORDERS_TABLE, ConsistentRead: true, ExclusiveStartKey }),
    );
    for (const order of page.Items ?? []) orders.push({ id: order.id.S, item: order.item.S });
    ExclusiveStartKey = page.LastEvaluatedKey;
  } while (ExclusiveStartKey);
  return orders;
}
