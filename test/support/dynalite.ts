import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import {
  CreateTableCommand,
  DynamoDBClient,
  type UpdateTimeToLiveCommandInput,
} from '@aws-sdk/client-dynamodb';
import dynalite from 'dynalite';
import { dynamodbStore } from '../../src/stores/dynamodb/index.js';

/** A dynalite server in this process, on a free loopback port, in memory. */
export interface Dynalite {
  /** Its `http://127.0.0.1:PORT` endpoint. */
  endpoint: string;
  /**
   * A client of it. dynalite has no `UpdateTimeToLive` (it does not model TTL at all): the client
   * answers that request itself, as DynamoDB would, and keeps what was asked in `ttlRequests`.
   */
  client(): DynamoDBClient;
  ttlRequests: UpdateTimeToLiveCommandInput[];
  close(): Promise<void>;
}

/** Dummy credentials and region: dynalite checks neither, the SDK wants both. */
export const DYNALITE_ENV = {
  AWS_REGION: 'us-east-1',
  AWS_ACCESS_KEY_ID: 'dynalite',
  AWS_SECRET_ACCESS_KEY: 'dynalite',
};

export async function startDynalite(): Promise<Dynalite> {
  // Tables are ACTIVE at once rather than after dynalite's default half second.
  const server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const ttlRequests: UpdateTimeToLiveCommandInput[] = [];
  const clients: DynamoDBClient[] = [];
  return {
    endpoint,
    ttlRequests,
    client() {
      const client = new DynamoDBClient({
        endpoint,
        region: DYNALITE_ENV.AWS_REGION,
        credentials: {
          accessKeyId: DYNALITE_ENV.AWS_ACCESS_KEY_ID,
          secretAccessKey: DYNALITE_ENV.AWS_SECRET_ACCESS_KEY,
        },
      });
      client.middlewareStack.add(
        (next, context) => async (args) => {
          if (context.commandName !== 'UpdateTimeToLiveCommand') return next(args);
          const input = args.input as UpdateTimeToLiveCommandInput;
          ttlRequests.push(input);
          return {
            output: { TimeToLiveSpecification: input.TimeToLiveSpecification, $metadata: {} },
            response: {},
          } as never;
        },
        { step: 'initialize', name: 'dynaliteHasNoTtl' },
      );
      clients.push(client);
      return client;
    },
    async close() {
      for (const client of clients) client.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * The tables examples/lambda/handler.js uses, made on `server` (the keys' by `store.migrate()`),
 * and the environment that points the handler's client and store at them.
 */
export async function lambdaExampleEnv(server: Dynalite): Promise<Record<string, string>> {
  const client = server.client();
  const tables = { IDEMPOTENCY_TABLE: `keys_${randomUUID()}`, ORDERS_TABLE: `orders_${randomUUID()}` };
  await dynamodbStore({ client, table: tables.IDEMPOTENCY_TABLE }).migrate();
  await client.send(
    new CreateTableCommand({
      TableName: tables.ORDERS_TABLE,
      AttributeDefinitions: [{ AttributeName: 'id', AttributeType: 'S' }],
      KeySchema: [{ AttributeName: 'id', KeyType: 'HASH' }],
      BillingMode: 'PAY_PER_REQUEST',
    }),
  );
  return { ...DYNALITE_ENV, ...tables, AWS_ENDPOINT_URL_DYNAMODB: server.endpoint };
}
