import { createHash } from 'node:crypto';
import {
  type AttributeValue,
  type ConditionalCheckFailedException,
  CreateTableCommand,
  DeleteItemCommand,
  DescribeTimeToLiveCommand,
  type DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  type ReturnValue,
  ScanCommand,
  UpdateItemCommand,
  UpdateTimeToLiveCommand,
  waitUntilTableExists,
} from '@aws-sdk/client-dynamodb';
import { ConfigError, RetrysafeError } from '../../core/contract/index.js';
import { checkOptions, optionNames } from '../../core/options/index.js';
import type {
  AbandonedOptions,
  AbandonedRecord,
  ClaimInput,
  ClaimResult,
  GetKeyOptions,
  IdempotencyStore,
  KeyPage,
  KeyRecord,
  KeyRecordSummary,
  ListKeysOptions,
  SavedStep,
  StoredResponse,
} from '../../core/store.js';
import {
  abandonedLimit,
  DEFAULT_PURGE_BATCH_SIZE,
  listCursor,
  listRequest,
  newToken,
  purgeInBatches,
  recordId,
  requirePositiveInteger,
  Waiters,
} from '../internal.js';
import { pollUntilSettled } from '../poll-wait.js';

/** Options of {@link dynamodbStore}. */
export interface DynamoDbStoreOptions {
  /**
   * The AWS SDK v3 client to use; the store never destroys it. Its retry strategy (the SDK's
   * default: 3 attempts with backoff) is what absorbs throttling.
   * @example client: new DynamoDBClient({ region: 'eu-west-1' })
   */
  client: DynamoDBClient;
  /**
   * The table's name. Its partition key is the string attribute `pk`, and its TTL attribute `ttl`
   * (what `migrate()` creates).
   * @example table: 'idempotency'
   */
  table: string;
  /**
   * Create the table (on-demand capacity, TTL on `ttl`) on first use when it is missing, as
   * `store.migrate()` does. Without it a call on a missing table fails with a `ConfigError` saying so.
   * @default false
   */
  migrate?: boolean;
}

/** A store on DynamoDB, which can also create its own table. */
export interface DynamoDbStore extends IdempotencyStore {
  /**
   * Creates the table when missing (on-demand capacity), waits until it is active and turns its
   * TTL on for the `ttl` attribute; safe to run again.
   */
  migrate(): Promise<void>;
}

const OPTION_NAMES = optionNames<DynamoDbStoreOptions>({ client: true, table: true, migrate: true });

/** DynamoDB's rule for table names. */
const TABLE_NAME = /^[A-Za-z0-9_.-]{3,255}$/;

/** Items one `Scan` call reads at most (it also stops at 1 MB). */
const SCAN_LIMIT = 500;
/** `Scan` calls one `list` page makes at most, so a page of a sparse scope answers in bounded time. */
const MAX_SCANS_PER_PAGE = 20;
/** Deletes a purge has in flight at once: enough to be quick, few enough not to meet throttling. */
const PURGE_CONCURRENCY = 25;

/** The longest record id kept as the partition key itself (DynamoDB allows 2048 bytes). */
const MAX_PLAIN_ID_BYTES = 1024;
/** Claims that found the record changing under them this many times in a row give up. */
const MAX_CLAIM_ROUNDS = 10;

type Item = Record<string, AttributeValue>;

/**
 * The partition key of a record id: the id itself, or, for a long scope and key, `#` and its
 * SHA-256 (a record id starts with a digit, so the two never meet).
 */
function partitionKeyOf(id: string): string {
  if (Buffer.byteLength(id) <= MAX_PLAIN_ID_BYTES) return id;
  return `#${createHash('sha256').update(id).digest('hex')}`;
}

const S = (value: string): AttributeValue => ({ S: value });
const N = (value: number): AttributeValue => ({ N: String(value) });
const num = (value: AttributeValue | undefined): number => Number(value?.N);
const str = (value: AttributeValue | undefined): string => value?.S ?? '';

/** DynamoDB's TTL attribute: epoch seconds, rounded up so that it never precedes `expiresAtMs`. */
const ttlOf = (expiresAtMs: number) => N(Math.ceil(expiresAtMs / 1000));

/**
 * `#name` placeholders for every attribute an expression names: most of ours (`key`, `status`,
 * `ttl`…) are DynamoDB reserved words, and every name given must be used.
 */
function namesIn(...expressions: (string | undefined)[]): Record<string, string> {
  const names: Record<string, string> = {};
  for (const expression of expressions) {
    for (const [placeholder, name] of expression?.matchAll(/#(\w+)/g) ?? []) names[placeholder] = name!;
  }
  return names;
}

const isCompleted = (item: Item) => item.status !== undefined;
/** Every read checks retention itself: DynamoDB's TTL deletes expired items lazily, within days. */
const isLive = (item: Item | undefined, nowMs: number): item is Item =>
  item !== undefined && num(item.expiresAtMs) > nowMs;

function stepsOf(item: Item): SavedStep[] {
  return (item.steps?.L ?? []).map((step) => ({ name: str(step.M?.name), value: str(step.M?.value) }));
}

function responseOf(item: Item): StoredResponse {
  return {
    status: num(item.status),
    headers: JSON.parse(str(item.headers)) as Record<string, string>,
    body: item.body?.B ?? new Uint8Array(0),
  };
}

function summaryOf(item: Item): KeyRecordSummary {
  const completed = isCompleted(item);
  const steps = stepsOf(item);
  return {
    scope: str(item.scope),
    key: str(item.key),
    state: completed ? 'completed' : 'in_progress',
    status: completed ? num(item.status) : null,
    createdAtMs: num(item.createdAtMs),
    expiresAtMs: num(item.expiresAtMs),
    leaseUntilMs: completed ? null : num(item.leaseUntilMs),
    ...(steps.length > 0 && { steps: steps.map((step) => step.name) }),
  };
}

/** What an existing, live record answers a claim with `input`; `undefined` when it may be taken over. */
function answerOf(item: Item, input: ClaimInput, nowMs: number): ClaimResult | undefined {
  if (str(item.fp) !== input.fingerprint) return { outcome: 'mismatch' };
  if (isCompleted(item)) return { outcome: 'replay', response: responseOf(item) };
  const leaseLeftMs = num(item.leaseUntilMs) - nowMs;
  return leaseLeftMs > 0 ? { outcome: 'in_progress', retryAfterMs: leaseLeftMs } : undefined;
}

/**
 * Whether `error` is the service's exception `name`. By name, not `instanceof`: the application's
 * client may come from another copy of @aws-sdk/client-dynamodb than the one this module imports.
 */
function isServiceError(error: unknown, name: string): error is Error {
  return error instanceof Error && error.name === name;
}

const conditionFailed = (error: unknown): error is ConditionalCheckFailedException =>
  isServiceError(error, 'ConditionalCheckFailedException');

/**
 * A store on Amazon DynamoDB through the AWS SDK v3 `DynamoDBClient`, for AWS Lambda and other
 * services that keep their state there. One item per `(scope, key)`: a claim is one conditional
 * `PutItem` (absent, or retention passed), a takeover one conditional `UpdateItem` on the dead
 * owner's token; complete, release, renew and saveStep are conditional on the owner token, so a
 * stale owner changes nothing. Every read is strongly consistent and checks retention itself
 * (DynamoDB's TTL deletes expired items lazily); leases run on this process's clock, as DynamoDB
 * has none to offer. `wait` polls.
 *
 * Lease mode only: DynamoDB transactions (`TransactWriteItems`) are one request of writes known in
 * advance, not a transaction a handler runs its own reads and writes in, so there is no atomic mode.
 * `list`, `abandoned` and `purgeExpired` scan the table.
 *
 * @example
 * ```ts
 * import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
 * import { dynamodbStore } from 'retrysafe/dynamodb';
 * const store = dynamodbStore({ client: new DynamoDBClient({}), table: 'idempotency', migrate: true });
 * ```
 */
export function dynamodbStore(given: DynamoDbStoreOptions): DynamoDbStore {
  const options = checkOptions('dynamodbStore()', given, OPTION_NAMES);
  const { client, table } = options;
  if (typeof client?.send !== 'function') {
    throw new ConfigError('dynamodbStore: `client` must be a DynamoDBClient of @aws-sdk/client-dynamodb');
  }
  if (typeof table !== 'string' || !TABLE_NAME.test(table)) {
    throw new ConfigError(`dynamodbStore: \`table\` must match ${TABLE_NAME} (got ${JSON.stringify(table)})`);
  }
  if (options.migrate !== undefined && typeof options.migrate !== 'boolean') {
    throw new ConfigError('dynamodbStore: `migrate` must be a boolean');
  }
  const waiters = new Waiters();
  let closed = false;
  let migrating: Promise<void> | undefined;

  async function migrate(): Promise<void> {
    try {
      await client.send(
        new CreateTableCommand({
          TableName: table,
          AttributeDefinitions: [{ AttributeName: 'pk', AttributeType: 'S' }],
          KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
          BillingMode: 'PAY_PER_REQUEST',
        }),
      );
    } catch (error) {
      if (!isServiceError(error, 'ResourceInUseException')) throw error;
    }
    await waitUntilTableExists({ client, maxWaitTime: 300, minDelay: 1, maxDelay: 5 }, { TableName: table });
    const described = await client.send(new DescribeTimeToLiveCommand({ TableName: table }));
    const status = described.TimeToLiveDescription?.TimeToLiveStatus;
    if (status === 'ENABLED' || status === 'ENABLING') return;
    await client.send(
      new UpdateTimeToLiveCommand({
        TableName: table,
        TimeToLiveSpecification: { Enabled: true, AttributeName: 'ttl' },
      }),
    );
  }

  /**
   * Sends one of the store's requests: a missing table is a ConfigError that says what to do, or,
   * with `migrate: true`, is created (once, however many calls find it missing) and the request
   * sent again (it did nothing the first time).
   */
  async function own<T>(request: () => Promise<T>): Promise<T> {
    try {
      return await request();
    } catch (error) {
      if (!isServiceError(error, 'ResourceNotFoundException')) throw error;
      if (!options.migrate) {
        throw new ConfigError(
          `dynamodbStore: the table ${table} does not exist. Create it with store.migrate(), or pass \`migrate: true\` (${error.message})`,
        );
      }
      migrating ??= migrate().finally(() => {
        migrating = undefined;
      });
      await migrating;
      return request();
    }
  }

  /** A conditional write: `true` when it was made, `false` when its condition did not hold. */
  async function conditional(request: () => Promise<unknown>): Promise<boolean> {
    try {
      await own(request);
      return true;
    } catch (error) {
      if (conditionFailed(error)) return false;
      throw error;
    }
  }

  const pkOf = (scope: string, key: string) => ({ pk: S(partitionKeyOf(recordId(scope, key))) });

  async function read(scope: string, key: string, projection?: string): Promise<Item | undefined> {
    const { Item } = await own(() =>
      client.send(
        new GetItemCommand({
          TableName: table,
          Key: pkOf(scope, key),
          ConsistentRead: true,
          ...(projection && {
            ProjectionExpression: projection,
            ExpressionAttributeNames: namesIn(projection),
          }),
        }),
      ),
    );
    return Item;
  }

  /** Every item of a scan with `filter` (values `:now` and `values`), page by page. */
  async function* scan(filter: string, values: Item, projection?: string, start?: Item) {
    let ExclusiveStartKey = start;
    do {
      const page = await own(() =>
        client.send(
          new ScanCommand({
            TableName: table,
            ConsistentRead: true,
            Limit: SCAN_LIMIT,
            FilterExpression: filter,
            ExpressionAttributeNames: namesIn(filter, projection),
            ExpressionAttributeValues: values,
            ...(projection && { ProjectionExpression: projection }),
            ExclusiveStartKey,
          }),
        ),
      );
      ExclusiveStartKey = page.LastEvaluatedKey;
      yield { items: page.Items ?? [], next: ExclusiveStartKey };
    } while (ExclusiveStartKey);
  }

  /** The condition of every owner's write: its token holds the record, in progress, within retention. */
  const OWNED = '#token = :token AND attribute_not_exists(#status) AND #expiresAtMs > :now';

  function update(
    scope: string,
    key: string,
    set: string,
    condition: string,
    values: Item,
    returnValues?: ReturnValue,
  ) {
    return new UpdateItemCommand({
      ...(returnValues && { ReturnValues: returnValues }),
      TableName: table,
      Key: pkOf(scope, key),
      UpdateExpression: set,
      ConditionExpression: condition,
      ExpressionAttributeNames: namesIn(set, condition),
      ExpressionAttributeValues: values,
    });
  }

  /**
   * Takes over `found`, whose lease has passed, for `token`: conditional on its owner token and
   * retention being what was read, so of concurrent takeovers one wins. Its retention counts from
   * the first claim, but never ends inside the new lease. `undefined` when it changed meanwhile.
   */
  async function takeOver(found: Item, input: ClaimInput, token: string, nowMs: number) {
    const leaseUntilMs = nowMs + input.leaseMs;
    const expiresAtMs = Math.max(num(found.expiresAtMs), leaseUntilMs);
    const condition =
      '#token = :old AND #expiresAtMs = :oldExpires AND attribute_not_exists(#status) AND #leaseUntilMs <= :now';
    const set = 'SET #token = :token, #leaseUntilMs = :lease, #expiresAtMs = :expires, #ttl = :ttl';
    const request = update(
      input.scope,
      input.key,
      set,
      condition,
      {
        ':old': found.token!,
        ':oldExpires': found.expiresAtMs!,
        ':now': N(nowMs),
        ':token': S(token),
        ':lease': N(leaseUntilMs),
        ':expires': N(expiresAtMs),
        ':ttl': ttlOf(expiresAtMs),
      },
      'ALL_NEW',
    );
    try {
      return (await own(() => client.send(request))).Attributes;
    } catch (error) {
      if (conditionFailed(error)) return undefined;
      throw error;
    }
  }

  function acquired(token: string, item: Item): ClaimResult {
    const steps = stepsOf(item);
    return steps.length > 0 ? { outcome: 'acquired', token, steps } : { outcome: 'acquired', token };
  }

  async function claim(input: ClaimInput): Promise<ClaimResult> {
    // One token for every attempt: a put the SDK retried after a lost answer finds its own claim.
    const token = newToken();
    for (let round = 1; round <= MAX_CLAIM_ROUNDS; round++) {
      const nowMs = Date.now();
      const expiresAtMs = nowMs + input.retainMs;
      const condition = 'attribute_not_exists(#pk) OR #expiresAtMs <= :now';
      let found: Item | undefined;
      try {
        await own(() =>
          client.send(
            new PutItemCommand({
              TableName: table,
              Item: {
                ...pkOf(input.scope, input.key),
                scope: S(input.scope),
                key: S(input.key),
                fp: S(input.fingerprint),
                token: S(token),
                createdAtMs: N(nowMs),
                leaseUntilMs: N(nowMs + input.leaseMs),
                expiresAtMs: N(expiresAtMs),
                ttl: ttlOf(expiresAtMs),
              },
              ConditionExpression: condition,
              ExpressionAttributeNames: namesIn(condition),
              ExpressionAttributeValues: { ':now': N(nowMs) },
              ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
            }),
          ),
        );
        return { outcome: 'acquired', token };
      } catch (error) {
        if (!conditionFailed(error)) throw error;
        // DynamoDB sends the record back (`ALL_OLD`); an emulator that does not is asked for it.
        found = error.Item ?? (await read(input.scope, input.key));
      }
      // Gone or expired since the put: claim it afresh.
      if (!isLive(found, nowMs)) continue;
      if (str(found.token) === token) return acquired(token, found);
      const answer = answerOf(found, input, nowMs);
      if (answer) return answer;
      const taken = await takeOver(found, input, token, nowMs);
      if (taken) return acquired(token, taken);
      // Another retry took it over, or its owner renewed or settled it: read it again.
    }
    throw new RetrysafeError(
      `dynamodbStore: the record of this key changed under ${MAX_CLAIM_ROUNDS} claims in a row (is the table ${table} shared with items of another shape?)`,
    );
  }

  async function complete(scope: string, key: string, token: string, response: StoredResponse) {
    const done = await conditional(() =>
      client.send(
        update(
          scope,
          key,
          'SET #status = :status, #headers = :headers, #body = :body REMOVE #request',
          OWNED,
          {
            ':token': S(token),
            ':now': N(Date.now()),
            ':status': N(response.status),
            ':headers': S(JSON.stringify(response.headers)),
            ':body': { B: response.body },
          },
        ),
      ),
    );
    if (done) waiters.wake(recordId(scope, key));
    return done;
  }

  async function release(scope: string, key: string, token: string) {
    const released = await conditional(() =>
      client.send(
        new DeleteItemCommand({
          TableName: table,
          Key: pkOf(scope, key),
          ConditionExpression: OWNED,
          ExpressionAttributeNames: namesIn(OWNED),
          ExpressionAttributeValues: { ':token': S(token), ':now': N(Date.now()) },
        }),
      ),
    );
    if (released) waiters.wake(recordId(scope, key));
    return released;
  }

  async function saveStep(scope: string, key: string, token: string, step: SavedStep, request?: string) {
    const append = '#steps = list_append(if_not_exists(#steps, :none), :step)';
    const values: Item = {
      ':token': S(token),
      ':now': N(Date.now()),
      ':none': { L: [] },
      ':step': { L: [{ M: { name: S(step.name), value: S(step.value) } }] },
    };
    if (request !== undefined) values[':request'] = S(request);
    const set = request === undefined ? `SET ${append}` : `SET ${append}, #request = :request`;
    return conditional(() => client.send(update(scope, key, set, OWNED, values)));
  }

  // DynamoDB's update expressions have no max(): the lease is renewed within retention by one
  // request, and past it by a second that moves retention too.
  async function renew(scope: string, key: string, token: string, leaseMs: number) {
    const nowMs = Date.now();
    const lease = N(nowMs + leaseMs);
    const values = { ':token': S(token), ':now': N(nowMs), ':lease': lease };
    const within = await conditional(() =>
      client.send(
        update(scope, key, 'SET #leaseUntilMs = :lease', `${OWNED} AND #expiresAtMs >= :lease`, values),
      ),
    );
    if (within) return true;
    return conditional(() =>
      client.send(
        update(
          scope,
          key,
          'SET #leaseUntilMs = :lease, #expiresAtMs = :lease, #ttl = :ttl',
          `${OWNED} AND #expiresAtMs < :lease`,
          { ...values, ':ttl': ttlOf(nowMs + leaseMs) },
        ),
      ),
    );
  }

  async function wait(scope: string, key: string, timeoutMs: number) {
    const id = recordId(scope, key);
    await pollUntilSettled(waiters, id, timeoutMs, async () => {
      if (closed) return null;
      const item = await read(scope, key, '#leaseUntilMs, #expiresAtMs, #status');
      const nowMs = Date.now();
      if (!isLive(item, nowMs) || isCompleted(item)) return null;
      const leftMs = num(item.leaseUntilMs) - nowMs;
      return leftMs > 0 ? leftMs : null;
    });
  }

  async function abandoned(given: AbandonedOptions = {}): Promise<AbandonedRecord[]> {
    const limit = abandonedLimit('dynamodbStore.abandoned', given);
    const nowMs = Date.now();
    const filter =
      'attribute_not_exists(#status) AND attribute_exists(#request) AND #leaseUntilMs <= :now AND #expiresAtMs > :now';
    const found: AbandonedRecord[] = [];
    for await (const { items } of scan(filter, { ':now': N(nowMs) })) {
      for (const item of items) {
        found.push({
          scope: str(item.scope),
          key: str(item.key),
          fingerprint: str(item.fp),
          request: str(item.request),
          leaseUntilMs: num(item.leaseUntilMs),
        });
      }
    }
    return found.sort((a, b) => a.leaseUntilMs - b.leaseUntilMs).slice(0, limit);
  }

  // Expired records found by a scan are deleted `batchSize` at a time, each delete conditional on
  // the record still being expired (a new claim may have replaced it meanwhile).
  async function purgeExpired(batchSize = DEFAULT_PURGE_BATCH_SIZE) {
    requirePositiveInteger('dynamodbStore.purgeExpired', 'batchSize', batchSize);
    const nowMs = Date.now();
    const expired = '#expiresAtMs <= :now';
    const pages = scan(expired, { ':now': N(nowMs) }, '#pk');
    const pending: Item[] = [];
    let scanned = false;
    let deleted = 0;
    const deleteOne = (Key: Item) =>
      conditional(() =>
        client.send(
          new DeleteItemCommand({
            TableName: table,
            Key,
            ConditionExpression: expired,
            ExpressionAttributeNames: namesIn(expired),
            ExpressionAttributeValues: { ':now': N(nowMs) },
          }),
        ),
      );
    await purgeInBatches(batchSize, async () => {
      while (pending.length < batchSize && !scanned) {
        const page = await pages.next();
        if (page.done) scanned = true;
        else pending.push(...page.value.items);
      }
      const batch = pending.splice(0, batchSize);
      for (let at = 0; at < batch.length; at += PURGE_CONCURRENCY) {
        const results = await Promise.all(batch.slice(at, at + PURGE_CONCURRENCY).map(deleteOne));
        deleted += results.filter(Boolean).length;
      }
      return batch.length;
    });
    return deleted;
  }

  // A scan in the table's own order (by hash of the record id), filtered to live records of the
  // scope; the cursor is the id of the last record taken, where the next page's scan starts.
  async function list(given: ListKeysOptions = {}): Promise<KeyPage> {
    const { limit, scope, after } = listRequest('dynamodbStore.list', given, 1);
    const filter = scope === undefined ? '#expiresAtMs > :now' : '#expiresAtMs > :now AND #scope = :scope';
    const values: Item = { ':now': N(Date.now()) };
    if (scope !== undefined) values[':scope'] = S(scope);
    const records: KeyRecordSummary[] = [];
    let taken = '';
    let calls = 0;
    for await (const { items, next } of scan(filter, values, undefined, after && { pk: S(after[0]!) })) {
      for (const item of items) {
        if (records.length === limit) return { records, next: listCursor([taken]) };
        records.push(summaryOf(item));
        taken = str(item.pk);
      }
      if (!next) break;
      if (++calls === MAX_SCANS_PER_PAGE) return { records, next: listCursor([str(next.pk)]) };
    }
    return { records, next: null };
  }

  async function get(scope: string, key: string, given?: GetKeyOptions): Promise<KeyRecord | undefined> {
    const item = await read(scope, key);
    if (!isLive(item, Date.now())) return undefined;
    const summary = summaryOf(item);
    return given?.response && isCompleted(item) ? { ...summary, response: responseOf(item) } : summary;
  }

  async function deleteRecord(scope: string, key: string) {
    const condition = 'attribute_exists(#pk) AND #expiresAtMs > :now';
    const deleted = await conditional(() =>
      client.send(
        new DeleteItemCommand({
          TableName: table,
          Key: pkOf(scope, key),
          ConditionExpression: condition,
          ExpressionAttributeNames: namesIn(condition),
          ExpressionAttributeValues: { ':now': N(Date.now()) },
        }),
      ),
    );
    if (deleted) waiters.wake(recordId(scope, key));
    return deleted;
  }

  return {
    name: 'dynamodb',
    migrate,
    claim,
    complete,
    release,
    saveStep,
    abandoned,
    renew,
    wait,
    purgeExpired,
    list,
    get,
    delete: deleteRecord,
    async close() {
      closed = true;
      waiters.wakeAll();
    },
  };
}
