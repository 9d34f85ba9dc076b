import { Redis } from 'ioredis';
import type {
  ClaimResult,
  IdempotencyStore,
  KeyRecordSummary,
  StoredResponse,
} from '../core/contract/index.js';
import { ConfigError, RetrysafeError } from '../core/contract/index.js';
import { checkOptions, optionNames, timerMs } from '../core/options/index.js';
import {
  DEFAULT_PURGE_BATCH_SIZE,
  listCursor,
  listRequest,
  newToken,
  parseRecordId,
  recordId,
  requirePositiveInteger,
  Waiters,
} from './internal.js';
import { pollUntilSettled } from './poll-wait.js';

/** Options of {@link redisStore}: one of `client` or `url`. */
export interface RedisStoreOptions {
  /**
   * An ioredis client to use; the store defines its scripts on it and never closes it, and the
   * commands sent on it in one turn of the event loop (the caller's too) go out in one write.
   * Give it a `commandTimeout` (or `maxRetriesPerRequest` and `enableOfflineQueue: false`) so
   * commands reject while Redis is down instead of queueing. One of `client`/`url`.
   * @default undefined
   * @example client: new Redis({ commandTimeout: 2000 })
   */
  client?: Redis;
  /**
   * A `redis://` URL; the store then owns a client built with the timeouts below.
   * @default undefined
   * @example url: 'redis://127.0.0.1:6379'
   */
  url?: string;
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

const MS_NOW = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

// Record format. A record is one string, so a claim is one native `SET … NX PX … GET`: it writes
// a new key, or answers the record there without writing. Lines, then the raw bytes:
//   in progress: P \n token \n leaseEndsBeforeExpiryMs \n createdBeforeExpiryMs \n fingerprint
//   completed:   C \n createdBeforeExpiryMs \n status \n fingerprint's byte length \n headers JSON \n fingerprint body
// Times count back from the key's own expiry, which Redis sets from its clock: the claim needs no
// clock of ours, and lease and creation times stay Redis's ("now" from the database server).
// Release 0.1.0 wrote hashes (fields fingerprint, state, token, lease_until_ms, created_at_ms,
// status, headers, body); those are honoured until they expire: a claim that meets one (`SET`
// answers WRONGTYPE) goes through CLAIM_HELD_LUA, which reads them as 0.1.0 did.
const LEGACY_HASH = `redis.call('TYPE', KEYS[1]).ok == 'hash'`;
// A Lua pattern: an in-progress record's lease offset, creation offset and fingerprint. It also
// reads the first 80 bytes of one (GETRANGE), whose fingerprint it then cuts short.
const IN_PROGRESS_FIELDS = `'^P\\n[^\\n]*\\n([^\\n]*)\\n([^\\n]*)\\n(.*)$'`;

// KEYS[1] record; ARGV fingerprint, in-progress record, retainMs. The claim of a key that holds a
// record in progress (its lease needs the key's TTL) or a 0.1.0 hash: what the native claim
// cannot decide. Replies like the native claim ({'record', value}) or as 0.1.0 did.
const CLAIM_HELD_LUA = `if ${LEGACY_HASH} then
  ${MS_NOW}
  local rec = redis.call('HMGET', KEYS[1], 'fingerprint', 'state', 'lease_until_ms', 'status', 'headers', 'body')
  if rec[1] then
    if rec[1] ~= ARGV[1] then return {'mismatch'} end
    if rec[2] == 'completed' then return {'replay', rec[4], rec[5], rec[6]} end
    local left = tonumber(rec[3]) - now
    if left > 0 then return {'in_progress', left} end
  end
  redis.call('DEL', KEYS[1])
else
  local value = redis.call('GET', KEYS[1])
  if value and string.sub(value, 1, 1) == 'P' then
    local leaseOffset, _, fingerprint = string.match(value, ${IN_PROGRESS_FIELDS})
    if fingerprint ~= ARGV[1] then return {'mismatch'} end
    local left = redis.call('PTTL', KEYS[1]) - tonumber(leaseOffset)
    if left > 0 then return {'in_progress', left} end
  elseif value then
    return {'record', value}
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {'acquired'}`;

// Is KEYS[1] the record in progress that ARGV[1] ("P \n token \n") owns? Sets \`value\`.
const OWNED = `local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' or string.sub(value, 1, #ARGV[1]) ~= ARGV[1] then return 0 end`;

// KEYS[1] record; ARGV owner prefix, status, headers JSON, body, channel. KEEPTTL: retention counts
// from the claim.
const COMPLETE_LUA = `${OWNED}
local _, created, fingerprint = string.match(value, ${IN_PROGRESS_FIELDS})
redis.call('SET', KEYS[1], 'C\\n' .. created .. '\\n' .. ARGV[2] .. '\\n' .. #fingerprint .. '\\n' .. ARGV[3] .. '\\n' .. fingerprint .. ARGV[4], 'KEEPTTL')
redis.call('PUBLISH', ARGV[5], KEYS[1])
return 1`;

// KEYS[1] record; ARGV owner prefix, channel.
const RELEASE_LUA = `${OWNED}
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], KEYS[1])
return 1`;

// KEYS[1] record; ARGV owner prefix, leaseMs. The key's TTL grows with the lease should the lease
// outlive it, and the offsets with it.
const RENEW_LUA = `${OWNED}
local _, created, fingerprint = string.match(value, ${IN_PROGRESS_FIELDS})
local lease = tonumber(ARGV[2])
local expiresIn = redis.call('PTTL', KEYS[1])
local grown = 0
if expiresIn < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
  grown = lease - expiresIn
  expiresIn = lease
end
redis.call('SET', KEYS[1], ARGV[1] .. string.format('%d\\n%d\\n', expiresIn - lease, tonumber(created) + grown) .. fingerprint, 'KEEPTTL')
return 1`;

// KEYS[1] record. Ms left on a live lease, or -1 when the record is not in progress.
const LEASE_LEFT_LUA = `local left
if ${LEGACY_HASH} then
  local rec = redis.call('HMGET', KEYS[1], 'state', 'lease_until_ms')
  if rec[1] ~= 'in_progress' then return -1 end
  ${MS_NOW}
  left = tonumber(rec[2]) - now
else
  local head = redis.call('GETRANGE', KEYS[1], 0, 79)
  local leaseOffset = string.match(head, ${IN_PROGRESS_FIELDS})
  if not leaseOffset then return -1 end
  left = redis.call('PTTL', KEYS[1]) - tonumber(leaseOffset)
end
if left <= 0 then return -1 end
return left`;

// KEYS records. Replies {now, {state, status, lease_until_ms, created_at_ms, ms to expiry} per key};
// state is nil for a key that is gone (or is not one of our records).
const SUMMARIES_LUA = `${MS_NOW}
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key).ok
  local expiresIn = redis.call('PTTL', key)
  out[i] = {false}
  if kind == 'hash' then
    local rec = redis.call('HMGET', key, 'state', 'status', 'lease_until_ms', 'created_at_ms')
    out[i] = {rec[1] or false, rec[2] or false, rec[3] or false, rec[4] or false, expiresIn}
  elseif kind == 'string' then
    local head = redis.call('GETRANGE', key, 0, 79)
    local leaseOffset, created = string.match(head, ${IN_PROGRESS_FIELDS})
    if leaseOffset then
      local expiresAt = now + expiresIn
      out[i] = {'in_progress', false, expiresAt - tonumber(leaseOffset), expiresAt - tonumber(created), expiresIn}
    else
      local created, status = string.match(head, '^C\\n([^\\n]*)\\n([^\\n]*)\\n')
      if created then out[i] = {'completed', status, false, now + expiresIn - tonumber(created), expiresIn} end
    end
  end
end
return {now, out}`;

// KEYS[1] record; ARGV channel.
const DELETE_LUA = `if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('PUBLISH', ARGV[1], KEYS[1])
return 1`;

type SummaryReply = [number, [string | null, string | null, string | null, string | null, number][]];

interface RetrysafeCommands {
  retrysafeClaimHeldBuffer(key: string, ...args: (string | number)[]): Promise<(Buffer | number | null)[]>;
  retrysafeComplete(key: string, ...args: (string | number | Buffer)[]): Promise<number>;
  retrysafeRelease(key: string, ...args: string[]): Promise<number>;
  retrysafeRenew(key: string, owner: string, leaseMs: number): Promise<number>;
  retrysafeLeaseLeft(key: string): Promise<number>;
  retrysafeSummaries(numberOfKeys: number, ...keys: string[]): Promise<SummaryReply>;
  retrysafeDelete(key: string, channel: string): Promise<number>;
}

const NEWLINE = 0x0a;
const IN_PROGRESS = 0x50; // 'P'

/** The first byte of an in-progress record, through the newline after its token. */
const ownerPrefix = (token: string) => `P\n${token}\n`;

/** A string record's answer to a claim with `fingerprint`; `undefined` for a record in progress. */
function answerOfRecord(value: Buffer, fingerprint: string): ClaimResult | undefined {
  if (value[0] === IN_PROGRESS) {
    let at = 0;
    for (let line = 0; line < 4; line++) at = value.indexOf(NEWLINE, at) + 1;
    return value.toString('utf8', at) === fingerprint ? undefined : { outcome: 'mismatch' };
  }
  const created = value.indexOf(NEWLINE, 2) + 1;
  const length = value.indexOf(NEWLINE, created) + 1;
  const headers = value.indexOf(NEWLINE, length) + 1;
  const rest = value.indexOf(NEWLINE, headers) + 1;
  const body = rest + Number(value.toString('latin1', length, headers - 1));
  if (value.toString('utf8', rest, body) !== fingerprint) return { outcome: 'mismatch' };
  return {
    outcome: 'replay',
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

function firstReady(client: Redis, timeoutMs: number): Promise<void> {
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
function writesPerTurn(client: Redis): () => void {
  let corked: Redis['stream'] | undefined;
  const uncork = () => {
    const stream = corked;
    corked = undefined;
    stream?.uncork();
  };
  return () => {
    if (corked !== undefined) return;
    const { stream } = client;
    if (!stream?.writable) return;
    corked = stream;
    stream.cork();
    setImmediate(uncork);
  };
}

function toBuffer(body: Uint8Array): Buffer {
  return Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

const OPTION_NAMES = optionNames<RedisStoreOptions>({
  client: true,
  url: true,
  prefix: true,
  commandTimeoutMs: true,
  connectTimeoutMs: true,
});

/** CLAIM_HELD_LUA's reply as a claim's answer. */
function heldAnswer(reply: (Buffer | number | null)[], token: string, fingerprint: string): ClaimResult {
  const outcome = String(reply[0]);
  switch (outcome) {
    case 'acquired':
      return { outcome: 'acquired', token };
    case 'mismatch':
      return { outcome: 'mismatch' };
    case 'in_progress':
      return { outcome: 'in_progress', retryAfterMs: Number(reply[1]) };
    case 'record':
      return answerOfRecord(reply[1] as Buffer, fingerprint)!;
    case 'replay':
      return {
        outcome: 'replay',
        response: {
          status: Number(String(reply[1])),
          headers: JSON.parse(String(reply[2])),
          body: (reply[3] as Buffer | null) ?? Buffer.alloc(0),
        },
      };
    default:
      throw new RetrysafeError(`redisStore: unexpected claim reply ${outcome}`);
  }
}

/**
 * A store on Redis (7.0 or later) through `ioredis`: a claim is one native `SET … NX … GET`, every
 * other step one Lua script (atomic, one round trip, times from the Redis server's clock), fenced by
 * the owner token; retention is the key's native TTL; `wait` listens on one pub/sub connection per
 * store, with polling as the fallback. Records written by 0.1.0 (hashes) are read until they expire.
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
  if ((options.client === undefined) === (options.url === undefined)) {
    throw new ConfigError('redisStore: give exactly one of `client` or `url`');
  }
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
  const client =
    options.client ??
    new Redis(options.url!, {
      commandTimeout: timerMs(commandTimeoutMs),
      connectTimeout: timerMs(connectTimeoutMs),
      // While Redis is down a command fails at once, and one in flight when the connection drops
      // fails then. Queued or resent, it would run whenever the connection came back, long after
      // its caller gave up: a claim nobody owns.
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      retryStrategy: (attempt) => Math.min(attempt * 50, MAX_RECONNECT_DELAY_MS),
    });
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
  client.defineCommand('retrysafeClaimHeld', { numberOfKeys: 1, lua: CLAIM_HELD_LUA });
  client.defineCommand('retrysafeComplete', { numberOfKeys: 1, lua: COMPLETE_LUA });
  client.defineCommand('retrysafeRelease', { numberOfKeys: 1, lua: RELEASE_LUA });
  client.defineCommand('retrysafeRenew', { numberOfKeys: 1, lua: RENEW_LUA });
  client.defineCommand('retrysafeLeaseLeft', { numberOfKeys: 1, lua: LEASE_LEFT_LUA, readOnly: true });
  client.defineCommand('retrysafeSummaries', { lua: SUMMARIES_LUA, readOnly: true });
  client.defineCommand('retrysafeDelete', { numberOfKeys: 1, lua: DELETE_LUA });
  const commands = client as unknown as RetrysafeCommands;

  const channel = `${prefix}settled`;
  const redisKey = (scope: string, key: string) => `${prefix}${recordId(scope, key)}`;
  const waiters = new Waiters();
  let subscriber: Redis | undefined;
  let closed = false;

  function subscribe(): void {
    if (subscriber || closed) return;
    // ioredis re-subscribes after a reconnect by itself; meanwhile waits poll.
    subscriber = client.duplicate({
      enableOfflineQueue: true,
      maxRetriesPerRequest: null,
      commandTimeout: undefined,
    });
    subscriber.on('error', () => {});
    subscriber.on('message', (from: string, key: string) => {
      if (from === channel) waiters.wake(key);
    });
    subscriber.subscribe(channel).catch(() => {});
  }

  async function summaries(ids: string[]): Promise<KeyRecordSummary[]> {
    if (ids.length === 0) return [];
    const [nowMs, rows] = await commands.retrysafeSummaries(ids.length, ...ids);
    return ids.flatMap((id, i) => {
      const [state, status, leaseUntilMs, createdAtMs, expiresInMs] = rows[i]!;
      const record = parseRecordId(id.slice(prefix.length));
      if (!state || !record) return [];
      const completed = state === 'completed';
      return [
        {
          ...record,
          state: completed ? 'completed' : 'in_progress',
          status: completed ? Number(status) : null,
          createdAtMs: Number(createdAtMs),
          expiresAtMs: nowMs + expiresInMs,
          leaseUntilMs: completed ? null : Number(leaseUntilMs),
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
      const retainMs = Math.max(input.leaseMs, input.ttlMs);
      const record = `${ownerPrefix(token)}${retainMs - input.leaseMs}\n${retainMs}\n${input.fingerprint}`;
      let found: Buffer | null | undefined;
      try {
        found = await client.setBuffer(id, record, 'PX', retainMs, 'NX', 'GET');
      } catch (error) {
        // A 0.1.0 hash: CLAIM_HELD_LUA reads it.
        if (!(error instanceof Error && error.message.startsWith('WRONGTYPE'))) throw error;
      }
      if (found === null) return { outcome: 'acquired', token };
      const answer = found && answerOfRecord(found, input.fingerprint);
      if (answer) return answer;
      const reply = await commands.retrysafeClaimHeldBuffer(id, input.fingerprint, record, retainMs);
      return heldAnswer(reply, token, input.fingerprint);
    },

    async complete(scope, key, token, response: StoredResponse) {
      if (!everReady) await connected();
      batchWrites();
      const done = await commands.retrysafeComplete(
        redisKey(scope, key),
        ownerPrefix(token),
        response.status,
        JSON.stringify(response.headers),
        toBuffer(response.body),
        channel,
      );
      return done === 1;
    },

    async release(scope, key, token) {
      if (!everReady) await connected();
      batchWrites();
      return (await commands.retrysafeRelease(redisKey(scope, key), ownerPrefix(token), channel)) === 1;
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
    // the next page runs that call again and takes what sorts after it.
    async list(options = {}) {
      const { limit, scope, after } = listRequest('redisStore.list', options, 2);
      await connected();
      const match = `${globEscape(prefix)}${scope === undefined ? '' : globEscape(recordId(scope, ''))}*`;
      let cursor = after?.[0] ?? '0';
      let takenThrough = after?.[1] || undefined;
      const ids: string[] = [];
      for (let calls = 1; ; calls++) {
        const [following, found] = await client.scan(cursor, 'MATCH', match, 'COUNT', SCAN_COUNT);
        const batch = found.sort().filter((id) => takenThrough === undefined || id > takenThrough);
        takenThrough = undefined;
        const room = limit - ids.length;
        if (batch.length > room) {
          ids.push(...batch.slice(0, room));
          return { records: await summaries(ids), next: listCursor([cursor, ids[ids.length - 1]!]) };
        }
        ids.push(...batch);
        if (following === '0') return { records: await summaries(ids), next: null };
        cursor = following;
        if (ids.length === limit || calls === MAX_SCANS_PER_PAGE) {
          return { records: await summaries(ids), next: listCursor([cursor, '']) };
        }
      }
    },

    async get(scope, key) {
      await connected();
      return (await summaries([redisKey(scope, key)]))[0];
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
