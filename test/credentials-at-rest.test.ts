import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import http, { type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/node.js';
import { credentialScope } from '../src/core/index.js';
import type { IdempotencyStore } from '../src/core/store.js';
import { memoryStore } from '../src/stores/memory.js';
import { postgresStore } from '../src/stores/postgres/index.js';
import { redisStore } from '../src/stores/redis/index.js';
import { sqliteStore } from '../src/stores/sqlite/index.js';
import { hasPostgres, hasRedis, PG_URL, REDIS_URL, uniqueName } from './support/services.js';

/**
 * No credential at rest (issue 9, item 10): a keyed request sent with a distinctive token under
 * each documented `scope` leaves no trace of the token in what the store received, nor in the
 * store's raw storage (SQL rows, Redis key names and values). The idempotency key itself must be
 * found there, so a scan that reads the wrong place cannot pass.
 */

interface OpenedStore {
  store: IdempotencyStore;
  /** Every byte the store keeps, as latin1 text (key names, columns, hash fields); memory: none to read. */
  dump?(): Promise<string>;
  cleanup(): Promise<void>;
}

const asText = (value: unknown): string =>
  value instanceof Uint8Array ? Buffer.from(value).toString('latin1') : String(value);

const tempDir = mkdtempSync(join(tmpdir(), 'rs-at-rest-'));
afterAll(() => rmSync(tempDir, { recursive: true, force: true }));

const stores: Array<{ name: string; skip: boolean; open(): Promise<OpenedStore> }> = [
  {
    name: 'memory',
    skip: false,
    // The memory store's records are private; what it was handed is what it can keep.
    async open() {
      const store = memoryStore();
      return { store, cleanup: () => store.close() };
    },
  },
  {
    name: 'sqlite',
    skip: false,
    async open() {
      const filename = join(tempDir, `${randomUUID()}.db`);
      const store = sqliteStore({ url: filename, migrate: true });
      return {
        store,
        async dump() {
          const reader = new Database(filename, { readonly: true });
          try {
            const tables = reader
              .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
              .pluck()
              .all();
            return (tables as string[])
              .flatMap((table) => reader.prepare(`SELECT * FROM "${table}"`).raw().all() as unknown[][])
              .map((row) => row.map(asText).join('\n'))
              .join('\n');
          } finally {
            reader.close();
          }
        },
        cleanup: () => store.close(),
      };
    },
  },
  {
    name: 'postgres',
    skip: !hasPostgres,
    async open() {
      const schema = uniqueName('rs_at_rest');
      const store = postgresStore({ url: PG_URL, schema });
      await store.migrate();
      const admin = new pg.Client({ connectionString: PG_URL });
      await admin.connect();
      return {
        store,
        async dump() {
          const { rows } = await admin.query({
            text: `SELECT * FROM "${schema}".idempotency_keys`,
            rowMode: 'array',
          });
          return (rows as unknown[][]).map((row) => row.map(asText).join('\n')).join('\n');
        },
        async cleanup() {
          await store.close();
          await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
          await admin.end();
        },
      };
    },
  },
  {
    name: 'redis',
    skip: !hasRedis,
    async open() {
      const prefix = `${uniqueName('rs_at_rest')}:`;
      const store = redisStore({ url: REDIS_URL, prefix });
      const admin = new Redis(REDIS_URL);
      const keys = async () => {
        const found: string[] = [];
        for await (const batch of admin.scanStream({ match: `${prefix}*`, count: 500 })) {
          found.push(...(batch as string[]));
        }
        return found;
      };
      return {
        store,
        async dump() {
          const parts: string[] = [];
          for (const key of await keys()) {
            const value = await admin.getBuffer(key);
            parts.push(key, value ? asText(value) : '');
          }
          return parts.join('\n');
        },
        async cleanup() {
          await store.close();
          const found = await keys();
          if (found.length > 0) await admin.del(...found);
          await admin.quit();
        },
      };
    },
  },
];

/** Wraps a store so every argument it is handed is kept, as text. */
function recording(store: IdempotencyStore): { store: IdempotencyStore; handed: string[] } {
  const handed: string[] = [];
  const wrapped = new Proxy(store, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        handed.push(JSON.stringify(args, (_name, v) => (v instanceof Uint8Array ? asText(v) : v)));
        return value.apply(target, args);
      };
    },
  });
  return { store: wrapped, handed };
}

// The scopes the README documents: the default, and `credentialScope` of another header.
const scopes: Array<[string, ((req: IncomingMessage) => string) | undefined]> = [
  ['the default scope (Authorization)', undefined],
  ["credentialScope(req.headers['x-api-key'])", (req) => credentialScope(req.headers['x-api-key'] as string)],
];

describe.each(stores)('no credential at rest: $name store', (setup) => {
  it.skipIf(setup.skip).each(scopes)('%s', async (_label, scope) => {
    const opened = await setup.open();
    const { store, handed } = recording(opened.store);
    const guard = idempotency({ store, scope });
    const server = http.createServer(
      guard((_req, res) => {
        res.writeHead(201, { 'content-type': 'application/json' });
        res.end('{"id":1}');
      }),
    );
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const token = `tok-${randomUUID()}`;
      const key = `key-${randomUUID()}`;
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/orders`;
      for (const expected of [null, 'true']) {
        const response = await fetch(url, {
          method: 'POST',
          headers: {
            'idempotency-key': key,
            authorization: `Bearer ${token}`,
            'x-api-key': token,
            'content-type': 'application/json',
          },
          body: '{"item":"book"}',
        });
        expect(response.status).toBe(201);
        expect(response.headers.get('idempotency-replayed')).toBe(expected);
      }
      for (const atRest of [handed.join('\n'), await opened.dump?.()]) {
        if (atRest === undefined) continue;
        expect(atRest).toContain(key);
        expect(atRest).not.toContain(token);
      }
    } finally {
      await new Promise((resolve) => server.close(resolve));
      await opened.cleanup();
    }
  });
});
