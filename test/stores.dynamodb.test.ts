import { randomUUID } from 'node:crypto';
import {
  ConditionalCheckFailedException,
  DescribeTableCommand,
  type DynamoDBClient,
  GetItemCommand,
} from '@aws-sdk/client-dynamodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError } from '../src/core/contract/index.js';
import { dynamodbStore } from '../src/stores/dynamodb/index.js';
import { describeIdempotentConformance } from '../src/testing/idempotent-suite.js';
import { describeStoreConformance } from '../src/testing/store-suite.js';
import { type Dynalite, startDynalite } from './support/dynalite.js';
import { claimInput, textResponse } from './support/store-calls.js';

let server: Dynalite;
let client: DynamoDBClient;
beforeAll(async () => {
  server = await startDynalite();
  client = server.client();
});
afterAll(() => server.close());

const table = () => `rs_${randomUUID()}`;

/** A store on a table of its own, made by `migrate: true` on first use. */
const onFreshTable = async () => ({
  store: dynamodbStore({ client, table: table(), migrate: true }),
  listsInScanOrder: true,
});
describeStoreConformance('dynamodb (dynalite)', onFreshTable);
describeIdempotentConformance('dynamodb (dynalite)', onFreshTable);

describe('dynamodbStore', () => {
  it('rejects bad options naming the option', () => {
    expect(() => dynamodbStore({ table: 'idempotency' } as never)).toThrow(/`client`/);
    expect(() => dynamodbStore({ client, table: 'a' })).toThrow(/`table`/);
    expect(() => dynamodbStore({ client, table: 'no spaces' })).toThrow(/`table`/);
    expect(() => dynamodbStore({ client, table: 'idempotency', migrate: 'yes' as never })).toThrow(
      /`migrate`/,
    );
    expect(() => dynamodbStore({ client, table: 'idempotency', tabel: 'x' } as never)).toThrow(/tabel/);
  });

  it('without migrate, a missing table is a ConfigError that says how to create it', async () => {
    const store = dynamodbStore({ client, table: table() });
    const failure = await store.claim(claimInput('k')).catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(ConfigError);
    expect((failure as Error).message).toMatch(/does not exist.*store\.migrate\(\).*migrate: true/);
    await store.close();
  });

  it('migrate() creates the table on demand with its TTL on `ttl`, and is safe to run again', async () => {
    const name = table();
    const store = dynamodbStore({ client, table: name });
    await store.migrate();
    await store.migrate();
    const { Table } = await client.send(new DescribeTableCommand({ TableName: name }));
    expect(Table).toMatchObject({
      TableStatus: 'ACTIVE',
      KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
      BillingModeSummary: { BillingMode: 'PAY_PER_REQUEST' },
    });
    const asked = server.ttlRequests.filter((request) => request.TableName === name);
    expect(asked.map((request) => request.TimeToLiveSpecification)).toEqual([
      { Enabled: true, AttributeName: 'ttl' },
      { Enabled: true, AttributeName: 'ttl' },
    ]);
    const claimed = await store.claim(claimInput('k'));
    expect(claimed.outcome).toBe('acquired');
    await store.close();
  });

  it('concurrent first calls on a missing table create it once and all go on', async () => {
    const name = table();
    const store = dynamodbStore({ client, table: name, migrate: true });
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) => store.claim(claimInput(`k${i % 2}`))),
    );
    expect(results.filter((result) => result.outcome === 'acquired')).toHaveLength(2);
    expect(server.ttlRequests.filter((request) => request.TableName === name)).toHaveLength(1);
    await store.close();
  });

  it('writes the TTL attribute in epoch seconds, never before the record expires', async () => {
    const name = table();
    const store = dynamodbStore({ client, table: name, migrate: true });
    const input = { ...claimInput('k'), retainMs: 90_500 };
    const claimed = await store.claim(input);
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    const { Item } = await client.send(
      new GetItemCommand({ TableName: name, Key: { pk: { S: `${'s'.length}:sk` } }, ConsistentRead: true }),
    );
    const expiresAtMs = Number(Item!.expiresAtMs!.N);
    expect(Number(Item!.ttl!.N)).toBe(Math.ceil(expiresAtMs / 1000));
    expect(await store.complete('s', 'k', claimed.token, textResponse('done'))).toBe(true);
    await store.close();
  });
});

describe('dynamodbStore edges', () => {
  it('a claim whose answer was lost and that the SDK sent again finds its own record: acquired', async () => {
    const name = table();
    const lossy = server.client();
    // The first PutItem reaches the table, then its answer is "lost": the SDK's retry sends it again.
    let lost = 0;
    lossy.middlewareStack.add(
      (next, context) => async (args) => {
        const result = await next(args);
        if (context.commandName === 'PutItemCommand' && lost++ === 0) {
          throw Object.assign(new Error('socket hang up'), { name: 'TimeoutError', $metadata: {} });
        }
        return result;
      },
      { step: 'deserialize', name: 'loseFirstPutAnswer' },
    );
    await dynamodbStore({ client, table: name }).migrate();
    const store = dynamodbStore({ client: lossy, table: name });
    const claimed = await store.claim(claimInput('k'));
    expect(lost).toBe(2);
    expect(claimed.outcome).toBe('acquired');
    if (claimed.outcome !== 'acquired') return;
    expect(await store.complete('s', 'k', claimed.token, textResponse('once'))).toBe(true);
    await store.close();
  });

  it('answers a held key from the record a failed condition sends back (ALL_OLD), reading nothing more', async () => {
    const name = table();
    const store = dynamodbStore({ client, table: name, migrate: true });
    const first = await store.claim(claimInput('k'));
    if (first.outcome !== 'acquired') throw new Error(first.outcome);
    expect(await store.complete('s', 'k', first.token, textResponse('saved'))).toBe(true);
    // DynamoDB returns the item with ConditionalCheckFailedException; dynalite does not, so this
    // client adds it as DynamoDB would, and counts the reads the store makes.
    const likeDynamoDb = server.client();
    const reads: string[] = [];
    likeDynamoDb.middlewareStack.add(
      (next, context) => async (args) => {
        if (context.commandName === 'GetItemCommand') reads.push('GetItem');
        try {
          return await next(args);
        } catch (error) {
          const input = args.input as { ReturnValuesOnConditionCheckFailure?: string; Key?: unknown };
          if (error instanceof ConditionalCheckFailedException && input.ReturnValuesOnConditionCheckFailure) {
            const { Item } = await client.send(
              new GetItemCommand({ TableName: name, Key: { pk: { S: '1:sk' } }, ConsistentRead: true }),
            );
            throw new ConditionalCheckFailedException({ message: error.message, $metadata: {}, Item });
          }
          throw error;
        }
      },
      { step: 'initialize', name: 'allOld' },
    );
    const replaying = dynamodbStore({ client: likeDynamoDb, table: name });
    const replay = await replaying.claim(claimInput('k'));
    expect(replay.outcome === 'replay' && new TextDecoder().decode(replay.response.body)).toBe('saved');
    expect(reads).toEqual([]);
    await Promise.all([store.close(), replaying.close()]);
  });

  it('keeps a long scope and key (past the partition key limit) as one record of its own', async () => {
    const store = dynamodbStore({ client, table: table(), migrate: true });
    const scope = 's'.repeat(1100);
    const input = { ...claimInput('k'.repeat(1024)), scope };
    const other = { ...input, key: `${'k'.repeat(1023)}x` };
    const claimed = await store.claim(input);
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    expect((await store.claim(other)).outcome).toBe('acquired');
    expect(await store.complete(scope, input.key, claimed.token, textResponse('long'))).toBe(true);
    expect((await store.claim(input)).outcome).toBe('replay');
    expect(await store.get(scope, input.key)).toMatchObject({ scope, key: input.key, state: 'completed' });
    const listed = await store.list({ scope });
    expect(listed.records.map((record) => record.key).sort()).toEqual([input.key, other.key].sort());
    await store.close();
  });
});
