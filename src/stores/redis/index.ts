import { Cluster, Redis } from 'ioredis';
import { ConfigError, RetrysafeError } from '../../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../../core/options/index.js';
import type {
  AbandonedRecord,
  ClaimResult,
  IdempotencyStore,
  KeyRecordSummary,
  SavedStep,
  StoredResponse,
} from '../../core/store.js';
import {
  abandonedLimit,
  DEFAULT_PURGE_BATCH_SIZE,
  listCursor,
  listRequest,
  newToken,
  parseRecordId,
  recordId,
  requirePositiveInteger,
  toBuffer,
  Waiters,
} from '../internal.js';
import { pollUntilSettled } from '../poll-wait.js';
import { defineScripts, type SummaryReply } from './scripts.js';

/** Options of {@link redisStore}: one of `client`, `url` or `clusterNodes`. */
export interface RedisStoreOptions {
  /**
   * An ioredis client to use, one Redis or a Redis Cluster; the store defines its scripts on it and
   * never closes it, and the commands sent on it in one turn of the event loop (the caller's too)
   * go out in one write per node. Give it a `commandTimeout` (a Cluster: in `redisOptions`) so
   * commands reject while Redis is down instead of queueing. One of `client`/`url`/`clusterNodes`.
   * @default undefined
   * @example client: new Redis({ commandTimeout: 2000 })
   */
  client?: Redis | Cluster;
  /**
   * A `redis://` URL; the store then owns a client built with the timeouts below.
   * @default undefined
   * @example url: 'redis://127.0.0.1:6379'
   */
  url?: string;
  /**
   * Seed nodes (`host:port`) of a Redis Cluster; the store then owns a Cluster client built with
   * the timeouts below, which finds the other nodes by itself.
   * @default undefined
   * @example clusterNodes: ['10.0.0.1:6379', '10.0.0.2:6379']
   */
  clusterNodes?: string[];
  /**
   * After a claim and after a saved response, wait (Redis `WAIT`) until `replicas` replicas of the
   * key's master hold the write, at most `timeoutMs`. A claim they do not confirm in time is
   * released and fails ({@link ReplicationError}: the engine answers 503, the client retries); a
   * save they do not confirm fails after it was made (the response is still sent; should the
   * master then fail over, the key reads in progress until its lease passes). Without it a claim
   * lost in a failover's replication gap lets a retry run the work again.
   * @default undefined (no WAIT)
   * @example durability: { replicas: 1, timeoutMs: 500 }
   */
  durability?: { replicas: number; timeoutMs: number };
  /**
   * Prepended to every key the store writes and to its pub/sub channel.
   * @default 'retrysafe:'
   * @example prefix: 'shop:idem:'
   */
  prefix?: string;
  /**
   * How long a command of the store's own client may take, queued while reconnecting included,
   * before it rejects: an outage answers an error, never a hang.
   * @default 2000
   */
  commandTimeoutMs?: number;
  /**
   * How long the store's own client may take to connect before a command rejects.
   * @default 2000
   */
  connectTimeoutMs?: number;
}

// The record format and the scripts that read and write it: ./scripts.ts.

const NEWLINE = 0x0a;
const IN_PROGRESS = 0x50; // 'P'

/** The first byte of an in-progress record, through the newline after its token. */
const ownerPrefix = (token: string) => `P\n${token}\n`;

/** A string record's answer to a claim with `fingerprint`; `undefined` for a record in progress. */
function answerOfRecord(value: Buffer, fingerprint: string): ClaimResult | undefined {
  if (value[0] === IN_PROGRESS) {
    let at = 0;
    for (let line = 0; line < 4; line++) at = value.indexOf(NEWLINE, at) + 1;
    const stepsAt = value.indexOf(NEWLINE, at);
    const saved = value.toString('utf8', at, stepsAt === -1 ? value.length : stepsAt);
    return saved === fingerprint ? undefined : { outcome: 'mismatch' };
  }
  const completed = completedRecord(value);
  if (completed.fingerprint !== fingerprint) return { outcome: 'mismatch' };
  return { outcome: 'replay', response: completed.response };
}

/** A completed string record's fingerprint and saved response. */
function completedRecord(value: Buffer): { fingerprint: string; response: StoredResponse } {
  const created = value.indexOf(NEWLINE, 2) + 1;
  const length = value.indexOf(NEWLINE, created) + 1;
  const headers = value.indexOf(NEWLINE, length) + 1;
  const rest = value.indexOf(NEWLINE, headers) + 1;
  const body = rest + Number(value.toString('latin1', length, headers - 1));
  return {
    fingerprint: value.toString('utf8', rest, body),
    response: {
      status: Number(value.toString('latin1', created, length - 1)),
      headers: JSON.parse(value.toString('utf8', headers, rest - 1)),
      body: value.subarray(body),
    },
  };
}

/**
 * `SCAN` hint: keys Redis examines per call, of the whole keyspace (other applications' keys
 * included). Small enough that one call never holds Redis up noticeably.
 */
const SCAN_COUNT = 250;
/** `SCAN` calls one `list` page makes at most, so a page of a sparse prefix answers in bounded time. */
const MAX_SCANS_PER_PAGE = 20;

const globEscape = (text: string) => text.replace(/[*?[\]\\]/g, '\\$&');

/** Reconnect attempts back off to this, so a restarted Redis is used again within half a second. */
const MAX_RECONNECT_DELAY_MS = 500;

function firstReady(client: Redis | Cluster, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      client.off('ready', onReady);
      reject(
        new RetrysafeError(
          `redisStore: no connection to Redis within ${timeoutMs} ms (\`connectTimeoutMs\`)`,
        ),
      );
    }, timerMs(timeoutMs));
    const onReady = () => {
      clearTimeout(timer);
      resolve();
    };
    client.once('ready', onReady);
  });
}

/**
 * Makes the commands sent on `client` during one turn of the event loop go out in one write: the
 * socket is corked at the first and uncorked when the turn ends. Concurrent requests then share a
 * syscall, and Redis a read, instead of one each (node-redis batches so by default; ioredis writes
 * every command at once). Commands a caller sends on a shared client in that turn go out with ours.
 */
function writesPerTurn(client: Redis | Cluster): () => void {
  let corked: Redis['stream'][] | undefined;
  const uncork = () => {
    const streams = corked;
    corked = undefined;
    for (const stream of streams ?? []) stream.uncork();
  };
  return () => {
    if (corked !== undefined) return;
    // A Cluster writes to each node on its own connection: every node's socket is corked.
    const nodes = client instanceof Cluster ? client.nodes('all') : [client];
    corked = nodes.map((node) => node.stream).filter((stream) => stream?.writable);
    for (const stream of corked) stream.cork();
    setImmediate(uncork);
  };
}

/**
 * Thrown by a store with `durability` when fewer replicas than asked confirmed a claim or a saved
 * response within `timeoutMs`. A claim is released first, so its retry can claim again.
 */
export class ReplicationError extends RetrysafeError {
  override name = 'ReplicationError';
}

function checkDurability(durability: unknown): { replicas: number; timeoutMs: number } {
  const { replicas, timeoutMs } = (durability ?? {}) as Record<string, unknown>;
  return {
    replicas: requirePositiveInteger('redisStore', 'durability.replicas', replicas),
    timeoutMs: requirePositiveInteger('redisStore', 'durability.timeoutMs', timeoutMs),
  };
}

/** The client a store given `url` or `clusterNodes` owns. */
function ownClient(options: RedisStoreOptions, commandTimeoutMs: number, connectTimeoutMs: number) {
  const timeouts = { commandTimeout: timerMs(commandTimeoutMs), connectTimeout: timerMs(connectTimeoutMs) };
  const reconnectDelayMs = (attempt: number) => Math.min(attempt * 50, MAX_RECONNECT_DELAY_MS);
  if (options.clusterNodes !== undefined) {
    if (!Array.isArray(options.clusterNodes) || options.clusterNodes.length === 0) {
      throw new ConfigError('redisStore: `clusterNodes` must be a non-empty array of "host:port"');
    }
    return new Cluster(options.clusterNodes, {
      // As below; the Cluster keeps a queue per node only while that node's connection opens.
      enableOfflineQueue: false,
      clusterRetryStrategy: reconnectDelayMs,
      redisOptions: { ...timeouts, maxRetriesPerRequest: 0 },
    });
  }
  return new Redis(options.url!, {
    ...timeouts,
    // While Redis is down a command fails at once, and one in flight when the connection drops
    // fails then. Queued or resent, it would run whenever the connection came back, long after
    // its caller gave up: a claim nobody owns.
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: reconnectDelayMs,
  });
}

/**
 * A Cluster's masters, each named by the first slot it serves (a name its replica keeps when it
 * takes over), in slot order.
 */
function mastersBySlot(cluster: Cluster): { firstSlot: string; node: Redis }[] {
  const byAddress = new Map(
    cluster.nodes('master').map((node) => [`${node.options.host}:${node.options.port}`, node]),
  );
  const masters: { firstSlot: string; node: Redis }[] = [];
  cluster.slots.forEach((addresses, slot) => {
    const node = byAddress.get(addresses[0]!);
    if (node === undefined) return;
    byAddress.delete(addresses[0]!);
    masters.push({ firstSlot: String(slot), node });
  });
  return masters;
}

/** Where a list cursor's master is now: the master serving its first slot (it may have failed over). */
function masterAt(masters: { firstSlot: string }[], firstSlot: string | undefined): number {
  if (firstSlot === undefined) return 0;
  let at = 0;
  while (at + 1 < masters.length && Number(masters[at + 1]!.firstSlot) <= Number(firstSlot)) at++;
  return at;
}

const OPTION_NAMES = optionNames<RedisStoreOptions>({
  client: true,
  url: true,
  clusterNodes: true,
  durability: true,
  prefix: true,
  commandTimeoutMs: true,
  connectTimeoutMs: true,
});

/** An in-progress record's steps, as SAVE_STEP_LUA wrote them. */
function stepsOfJson(json: string): { steps: SavedStep[]; request?: string } {
  const data = JSON.parse(json) as { steps: SavedStep[] | Record<string, never>; request?: string };
  // cjson writes an empty array as an object; SAVE_STEP_LUA never leaves it empty, but be sure.
  return { steps: Array.isArray(data.steps) ? data.steps : [], request: data.request };
}

/** CLAIM_HELD_LUA's reply as a claim's answer. */
function heldAnswer(reply: (Buffer | number | null)[], token: string, fingerprint: string): ClaimResult {
  const outcome = String(reply[0]);
  switch (outcome) {
    case 'acquired': {
      const steps = reply[1] ? String(reply[1]) : '';
      if (steps === '') return { outcome: 'acquired', token };
      return { outcome: 'acquired', token, steps: stepsOfJson(steps.slice(1)).steps };
    }
    case 'mismatch':
      return { outcome: 'mismatch' };
    case 'in_progress':
      return { outcome: 'in_progress', retryAfterMs: Number(reply[1]) };
    case 'record':
      return answerOfRecord(reply[1] as Buffer, fingerprint)!;
    default:
      throw new RetrysafeError(`redisStore: unexpected claim reply ${outcome}`);
  }
}

/**
 * A store on Redis (7.0 or later) through `ioredis`: a claim is one native `SET … NX … GET`, every
 * other step one Lua script (atomic, one round trip, times from the Redis server's clock), fenced by
 * the owner token; retention is the key's native TTL; `wait` listens on one pub/sub connection per
 * store, with polling as the fallback.
 *
 * Durability: Redis is a cache unless configured otherwise. A Redis without persistence (no AOF,
 * no RDB, as many deployments run it) forgets every key when it restarts, so a retry that arrives
 * after a restart runs the operation again; with RDB snapshots it forgets the keys written since
 * the last snapshot. Use `appendonly yes` (`appendfsync everysec` or `always`) for keys that must
 * survive a restart, or the PostgreSQL store in atomic mode for exactly-once writes that live in
 * SQL. There is no atomic mode here: the lease protocol gives at most one concurrent execution, and
 * a re-execution only after a crash and the lease's expiry.
 *
 * `purgeExpired` deletes nothing and answers 0: Redis expires the keys itself.
 *
 * @example
 * ```ts
 * import { redisStore } from 'retrysafe/redis';
 * const store = redisStore({ url: 'redis://127.0.0.1:6379', prefix: 'shop:idem:' });
 * ```
 */
export function redisStore(given: RedisStoreOptions): IdempotencyStore {
  const options = checkOptions('redisStore()', given, OPTION_NAMES);
  const sources = [options.client, options.url, options.clusterNodes].filter((o) => o !== undefined);
  if (sources.length !== 1) {
    throw new ConfigError('redisStore: give exactly one of `client`, `url` or `clusterNodes`');
  }
  const durability = options.durability && checkDurability(options.durability);
  const prefix = options.prefix ?? 'retrysafe:';
  if (typeof prefix !== 'string') throw new ConfigError('redisStore: `prefix` must be a string');
  const commandTimeoutMs = requirePositiveInteger(
    'redisStore',
    'commandTimeoutMs',
    options.commandTimeoutMs ?? 2000,
  );
  const connectTimeoutMs = requirePositiveInteger(
    'redisStore',
    'connectTimeoutMs',
    options.connectTimeoutMs ?? 2000,
  );

  const ownsClient = options.client === undefined;
  const client = options.client ?? ownClient(options, commandTimeoutMs, connectTimeoutMs);
  const cluster = client instanceof Cluster ? client : undefined;
  // ioredis reports connection errors as events and reconnects by itself. A database the URL
  // names that Redis refuses (`redis://host/99` on a 16-database server) is one of them, after
  // which ioredis carries on in database 0: the store refuses to, rather than mix records.
  let refusedDatabase: Error | undefined;
  if (ownsClient) {
    client.on('error', (error: Error) => {
      if (/DB index is out of range/.test(error.message)) {
        refusedDatabase = new ConfigError(
          `redisStore: Redis refuses the database ${new URL(options.url!).pathname.slice(1)} that \`url\` names (${error.message})`,
        );
      }
    });
  }
  // Without an offline queue, calls made before the first connection is up would fail.
  let everReady = !ownsClient || client.status === 'ready';
  if (!everReady) client.once('ready', () => (everReady = true));
  async function connected(): Promise<void> {
    if (!everReady) await firstReady(client, connectTimeoutMs);
    if (refusedDatabase) throw refusedDatabase;
  }
  // The request path's commands (claim, complete, release, renew) go out in per-turn batches.
  const batchWrites = writesPerTurn(client);
  const commands = defineScripts(client);

  const channel = `${prefix}settled`;
  const redisKey = (scope: string, key: string) => `${prefix}${recordId(scope, key)}`;
  const waiters = new Waiters();
  let subscriber: Redis | Cluster | undefined;
  let closed = false;

  function subscribe(): void {
    if (subscriber || closed) return;
    // ioredis re-subscribes after a reconnect by itself; meanwhile waits poll.
    const patient = { maxRetriesPerRequest: null, commandTimeout: undefined };
    subscriber = cluster
      ? cluster.duplicate(undefined, {
          enableOfflineQueue: true,
          redisOptions: { ...cluster.options.redisOptions, ...patient },
        })
      : (client as Redis).duplicate({ enableOfflineQueue: true, ...patient });
    subscriber.on('error', () => {});
    subscriber.on('message', (from: string, key: string) => {
      if (from === channel) waiters.wake(key);
    });
    subscriber.subscribe(channel).catch(() => {});
  }

  /**
   * How many replicas hold the writes made so far on the connection to `id`'s node (WAIT counts
   * per connection). The EXISTS only routes the WAIT there on a Cluster; one round trip.
   */
  async function replicated(id: string): Promise<number> {
    const { replicas, timeoutMs } = durability!;
    const [, [error, count]] = (await client.pipeline().exists(id).wait(replicas, timeoutMs).exec()) as [
      unknown,
      [Error | null, number],
    ];
    if (error) throw error;
    return Number(count);
  }

  const shortOfReplicas = (what: string, replicas: number) =>
    new ReplicationError(
      `redisStore: ${replicas} of the ${durability!.replicas} replicas asked for confirmed the ${what} within ${durability!.timeoutMs} ms (\`durability\`)`,
    );

  // One script reads many keys of one Redis; on a Cluster each key may be on another slot.
  async function summaries(ids: string[]): Promise<KeyRecordSummary[]> {
    const groups = cluster ? ids.map((id) => [id]) : ids.length > 0 ? [ids] : [];
    const replies = await Promise.all(
      groups.map((group) => commands.retrysafeSummaries(group.length, ...group)),
    );
    return groups.flatMap((group, g) => summariesOf(group, replies[g]!));
  }

  /** The saved response of the completed record `id`. */
  async function savedResponse(id: string): Promise<StoredResponse | undefined> {
    const value = await client.getBuffer(id);
    return value && value[0] !== IN_PROGRESS ? completedRecord(value).response : undefined;
  }

  function summariesOf(ids: string[], rows: SummaryReply): KeyRecordSummary[] {
    return ids.flatMap((id, i) => {
      const [state, status, leaseUntilMs, createdAtMs, expiresAtMs, steps] = rows[i]!;
      const record = parseRecordId(id.slice(prefix.length));
      if (!state || !record) return [];
      const completed = state === 'completed';
      return [
        {
          ...record,
          state: completed ? 'completed' : 'in_progress',
          status: completed ? Number(status) : null,
          createdAtMs: Number(createdAtMs),
          expiresAtMs,
          leaseUntilMs: completed ? null : Number(leaseUntilMs),
          ...(steps && { steps: stepsOfJson(steps.slice(1)).steps.map((step) => step.name) }),
        },
      ];
    });
  }

  return {
    name: 'redis',

    async claim(input): Promise<ClaimResult> {
      if (!everReady) await connected();
      batchWrites();
      const token = newToken();
      const id = redisKey(input.scope, input.key);
      const { retainMs } = input;
      const record = `${ownerPrefix(token)}${retainMs - input.leaseMs}\n${retainMs}\n${input.fingerprint}`;
      const found = await client.setBuffer(id, record, 'PX', retainMs, 'NX', 'GET');
      let answer: ClaimResult | undefined = found === null ? { outcome: 'acquired', token } : undefined;
      answer ??= found ? answerOfRecord(found, input.fingerprint) : undefined;
      if (!answer) {
        const reply = await commands.retrysafeClaimHeldBuffer(id, input.fingerprint, record, retainMs);
        answer = heldAnswer(reply, token, input.fingerprint);
      }
      if (durability && answer.outcome === 'acquired') {
        const replicas = await replicated(id);
        if (replicas < durability.replicas) {
          // A takeover's finished steps must outlive the refused claim (deleted, the retry would
          // run them again): its lease is ended instead.
          const letGo = answer.steps?.length
            ? commands.retrysafeRenew(id, ownerPrefix(token), 1)
            : commands.retrysafeRelease(id, ownerPrefix(token), channel);
          await letGo.catch(() => {});
          throw shortOfReplicas('claim', replicas);
        }
      }
      return answer;
    },

    async complete(scope, key, token, response: StoredResponse) {
      if (!everReady) await connected();
      batchWrites();
      const id = redisKey(scope, key);
      const done = await commands.retrysafeComplete(
        id,
        ownerPrefix(token),
        response.status,
        JSON.stringify(response.headers),
        toBuffer(response.body),
        channel,
      );
      if (done === 1 && durability) {
        const replicas = await replicated(id);
        if (replicas < durability.replicas) throw shortOfReplicas('saved response', replicas);
      }
      return done === 1;
    },

    async release(scope, key, token) {
      if (!everReady) await connected();
      batchWrites();
      return (await commands.retrysafeRelease(redisKey(scope, key), ownerPrefix(token), channel)) === 1;
    },

    async saveStep(scope, key, token, step, request) {
      if (!everReady) await connected();
      batchWrites();
      const id = redisKey(scope, key);
      return (
        (await commands.retrysafeSaveStep(id, ownerPrefix(token), step.name, step.value, request ?? '')) === 1
      );
    },

    // A walk of the whole prefix (SCAN), each batch read in one script: a completer's pass costs
    // time in the number of records, which Redis deployments of this store keep short-lived.
    async abandoned(options = {}) {
      const limit = abandonedLimit('redisStore.abandoned', options);
      await connected();
      const found: AbandonedRecord[] = [];
      // On a Cluster every master is walked, and each record read by a script of its own (slot).
      const nodes = cluster ? mastersBySlot(cluster).map((master) => master.node) : [client as Redis];
      for (const node of nodes) {
        let cursor = '0';
        do {
          const [following, ids] = await node.scan(
            cursor,
            'MATCH',
            `${globEscape(prefix)}*`,
            'COUNT',
            SCAN_COUNT,
          );
          cursor = following;
          if (ids.length === 0) continue;
          const nowMs = Date.now();
          const groups = cluster ? ids.map((id) => [id]) : [ids];
          const replies = await Promise.all(
            groups.map((group) => commands.retrysafeAbandoned(group.length, ...group)),
          );
          replies.flat().forEach((row, i) => {
            const record = row && parseRecordId(ids[i]!.slice(prefix.length));
            const { request } = row ? stepsOfJson(row[1]) : {};
            if (!row || !record || request === undefined) return;
            found.push({ ...record, fingerprint: row[0], request, leaseUntilMs: nowMs - Number(row[2]) });
          });
        } while (cursor !== '0');
      }
      return found.sort((a, b) => a.leaseUntilMs - b.leaseUntilMs).slice(0, limit);
    },

    async renew(scope, key, token, leaseMs) {
      if (!everReady) await connected();
      batchWrites();
      return (await commands.retrysafeRenew(redisKey(scope, key), ownerPrefix(token), leaseMs)) === 1;
    },

    async wait(scope, key, timeoutMs) {
      await connected();
      subscribe();
      const id = redisKey(scope, key);
      await pollUntilSettled(waiters, id, timeoutMs, async () => {
        const leftMs = await commands.retrysafeLeaseLeft(id);
        return leftMs > 0 ? leftMs : null;
      });
    },

    async purgeExpired(batchSize = DEFAULT_PURGE_BATCH_SIZE) {
      requirePositiveInteger('redisStore.purgeExpired', 'batchSize', batchSize);
      return 0;
    },

    // The cursor is a SCAN cursor and the last record taken from the batch that SCAN call returned:
    // the next page runs that call again and takes what sorts after it. On a Cluster it names the
    // master too (by the first slot it serves), and the masters are scanned one after the other.
    async list(options = {}) {
      const { limit, scope, after } = listRequest('redisStore.list', options, cluster ? 3 : 2);
      await connected();
      const match = `${globEscape(prefix)}${scope === undefined ? '' : globEscape(recordId(scope, ''))}*`;
      const masters = cluster ? mastersBySlot(cluster) : [{ firstSlot: '', node: client as Redis }];
      let at = cluster ? masterAt(masters, after?.[0]) : 0;
      const position = cluster ? after?.slice(1) : after;
      let cursor = position?.[0] ?? '0';
      let takenThrough = position?.[1] || undefined;
      const ids: string[] = [];
      const page = async (next: [string, string] | null) => ({
        records: await summaries(ids),
        next: next && listCursor(cluster ? [masters[at]!.firstSlot, ...next] : next),
      });
      for (let calls = 1; ; calls++) {
        const [following, found] = await masters[at]!.node.scan(cursor, 'MATCH', match, 'COUNT', SCAN_COUNT);
        const batch = found.sort().filter((id) => takenThrough === undefined || id > takenThrough);
        takenThrough = undefined;
        const room = limit - ids.length;
        if (batch.length > room) {
          ids.push(...batch.slice(0, room));
          return page([cursor, ids[ids.length - 1]!]);
        }
        ids.push(...batch);
        cursor = following;
        if (cursor === '0') {
          if (at === masters.length - 1) return page(null);
          at++;
        }
        if (ids.length === limit || calls === MAX_SCANS_PER_PAGE) return page([cursor, '']);
      }
    },

    async get(scope, key, options) {
      await connected();
      const id = redisKey(scope, key);
      const summary = (await summaries([id]))[0];
      if (!options?.response || summary?.state !== 'completed') return summary;
      // A completed record never changes until it expires; gone meanwhile, it is reported gone.
      const response = await savedResponse(id);
      return response && { ...summary, response };
    },

    async delete(scope, key) {
      await connected();
      return (await commands.retrysafeDelete(redisKey(scope, key), channel)) === 1;
    },

    async close() {
      closed = true;
      waiters.wakeAll();
      subscriber?.disconnect();
      subscriber = undefined;
      if (ownsClient) await client.quit().catch(() => client.disconnect());
    },
  };
}
