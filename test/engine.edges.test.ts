import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type CapturedResponse, createIdempotency } from '../src/core/adapter.js';
import { ConfigError } from '../src/core/index.js';
import { type IdempotencyStore, isAtomicStore } from '../src/core/store.js';
import { memoryStore } from '../src/stores/memory.js';
import { postgresStore } from '../src/stores/postgres/index.js';
import { redisStore } from '../src/stores/redis/index.js';
import { sqliteStore } from '../src/stores/sqlite/index.js';
import { postRequest } from '../src/testing/engine-request.js';
import {
  deleteRedisKeys,
  dropSchemas,
  hasPostgres,
  hasRedis,
  PG_URL,
  REDIS_URL,
  uniqueName,
} from './support/services.js';

/**
 * The edges of the engine's limits on every store: durations past setTimeout's 2^31-1 ms (a 30-day
 * `ttl`, `lease` and `wait`) and the longest key `maxKeyLength` allows, with a long scope. Timers
 * Node cannot hold fire at once with a TimeoutOverflowWarning, and PostgreSQL refuses timeouts
 * past 2^31-1 ms and index rows past 2,704 bytes; each answer here is checked, not its timing.
 */

const THIRTY_DAYS = '30d';
const LONGEST_KEY_LENGTH = 1024;

interface Backend {
  name: string;
  skip: boolean;
  open(): IdempotencyStore;
  cleanup(): Promise<void>;
}

const dir = mkdtempSync(path.join(tmpdir(), 'rs-edges-'));
const schema = uniqueName('rs_edges');
const redisPrefix = `${uniqueName('rs_edges')}:`;
const backends: Backend[] = [
  { name: 'memory', skip: false, open: () => memoryStore(), cleanup: async () => {} },
  {
    name: 'SQLite',
    skip: false,
    open: () => sqliteStore({ url: path.join(dir, 'keys.db'), migrate: true }),
    cleanup: async () => rmSync(dir, { recursive: true, force: true }),
  },
  {
    name: 'PostgreSQL',
    skip: !hasPostgres,
    open: () => postgresStore({ url: PG_URL, schema }),
    cleanup: async () => {
      if (hasPostgres) await dropSchemas(schema);
    },
  },
  {
    name: 'Redis',
    skip: !hasRedis,
    open: () => redisStore({ url: REDIS_URL, prefix: redisPrefix }),
    async cleanup() {
      if (hasRedis) await deleteRedisKeys(redisPrefix);
    },
  },
];

const warnings: Error[] = [];
const onWarning = (warning: Error) => warnings.push(warning);
beforeAll(() => {
  process.on('warning', onWarning);
});
afterAll(async () => {
  process.off('warning', onWarning);
  for (const backend of backends) await backend.cleanup();
});

const created: CapturedResponse = {
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: Buffer.from('{"id":1}'),
  complete: true,
};

it('maxKeyLength above what every store indexes is a ConfigError naming the bound', () => {
  const store = memoryStore();
  expect(() => createIdempotency({ store, maxKeyLength: LONGEST_KEY_LENGTH + 1 })).toThrow(ConfigError);
  expect(() => createIdempotency({ store, maxKeyLength: LONGEST_KEY_LENGTH + 1 })).toThrow(
    /`maxKeyLength` must be at most 1024/,
  );
  expect(() => createIdempotency({ store, maxKeyLength: LONGEST_KEY_LENGTH })).not.toThrow();
});

describe.each(backends)('$name store', (backend) => {
  let store: IdempotencyStore;
  beforeAll(async () => {
    if (backend.skip) return;
    store = backend.open();
    await (store as { migrate?: () => Promise<void> }).migrate?.();
  });
  afterAll(async () => {
    if (!backend.skip) await store.close();
  });

  const modes = ['lease', 'atomic'] as const;
  describe.each(modes)('%s mode', (mode) => {
    const skip = () => backend.skip || (mode === 'atomic' && !isAtomicStore(store));

    it('30-day ttl, lease and wait: the original runs once, a duplicate waits and replays, no timer overflows', async (context) => {
      if (skip()) return context.skip();
      warnings.length = 0;
      const idempotency = createIdempotency({
        store,
        mode,
        ttl: THIRTY_DAYS,
        lease: THIRTY_DAYS,
        wait: THIRTY_DAYS,
      });
      const key = uniqueName(`${mode}-30d`);
      let runs = 0;
      let entered!: () => void;
      const inside = new Promise<void>((resolve) => {
        entered = resolve;
      });
      const original = idempotency.handle(postRequest(key), async () => {
        runs++;
        entered();
        await sleep(300);
        return created;
      });
      await inside;
      const duplicate = idempotency.handle(postRequest(key), async () => {
        runs++;
        return created;
      });
      const outcomes = await Promise.all([original, duplicate]);
      expect(outcomes.map((outcome) => outcome.kind)).toEqual(['executed', 'replayed']);
      expect(runs).toBe(1);
      expect(warnings.map((warning) => warning.name)).not.toContain('TimeoutOverflowWarning');
    });

    it('the longest key maxKeyLength allows, in a long user scope, is executed and replayed', async (context) => {
      if (skip()) return context.skip();
      // Random, so that PostgreSQL cannot compress the index row below its limit.
      const scope = `tenant-é-${randomBytes(1500).toString('base64')}`;
      const idempotency = createIdempotency({
        store,
        mode,
        maxKeyLength: LONGEST_KEY_LENGTH,
        scope: () => scope,
      });
      const key = randomBytes(LONGEST_KEY_LENGTH).toString('base64url').slice(0, LONGEST_KEY_LENGTH);
      let runs = 0;
      const run = async () => {
        runs++;
        return created;
      };
      const first = await idempotency.handle(postRequest(key), run);
      expect(first.kind === 'rejected' ? first.error.message : first.kind).toBe('executed');
      expect((await idempotency.handle(postRequest(key), run)).kind).toBe('replayed');
      expect(runs).toBe(1);
    });
  });

  it('wait past 2^31 ms on an in-progress key returns when the key completes, without a TimeoutOverflowWarning', async (context) => {
    if (backend.skip) return context.skip();
    warnings.length = 0;
    const input = {
      scope: 'edges',
      key: uniqueName('wait'),
      fingerprint: 'f',
      leaseMs: 30 * 86_400_000,
      retainMs: 30 * 86_400_000,
      timeoutMs: 30 * 86_400_000,
    };
    const claimed = await store.claim(input);
    if (claimed.outcome !== 'acquired') throw new Error(`expected acquired, got ${claimed.outcome}`);
    const waiting = store.wait(input.scope, input.key, 30 * 86_400_000);
    await sleep(300);
    await store.complete(input.scope, input.key, claimed.token, {
      status: 201,
      headers: {},
      body: Buffer.from(''),
    });
    await waiting;
    expect(warnings.map((warning) => warning.name)).not.toContain('TimeoutOverflowWarning');
  });
});
