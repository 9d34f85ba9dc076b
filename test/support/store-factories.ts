import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { memoryStore } from '../../src/stores/memory.js';
import { mysqlStore } from '../../src/stores/mysql/index.js';
import { type PostgresStoreOptions, postgresStore } from '../../src/stores/postgres/index.js';
import { redisStore } from '../../src/stores/redis/index.js';
import { sqliteStore } from '../../src/stores/sqlite/index.js';
import type { StoreFactory } from '../../src/testing/adapter-suite.js';
import { hasPgBouncer, startPgBouncer } from './pgbouncer.js';
import {
  deleteRedisKeys,
  dropSchemas,
  hasMysql,
  hasPostgres,
  hasRedis,
  mysqlDatabase,
  PG_URL,
  REDIS_URL,
  uniqueName,
} from './services.js';

export type { StoreFactory };

export const memory: StoreFactory = { name: 'memory', open: async () => ({ store: memoryStore() }) };

export const sqlite: StoreFactory = {
  name: 'sqlite',
  atomic: true,
  async open() {
    const dir = mkdtempSync(join(tmpdir(), 'retrysafe-adapter-'));
    return {
      store: sqliteStore({ url: join(dir, 'keys.db'), migrate: true }),
      cleanup: async () => rmSync(dir, { recursive: true, force: true }),
    };
  },
};

/** A PostgreSQL store in a schema of its own at `url`, dropped by its cleanup. */
async function openPostgres(url: string, options: Partial<PostgresStoreOptions> = {}) {
  const schema = uniqueName('rs_adapter');
  const store = postgresStore({ url: url, schema, ...options });
  await store.migrate();
  return { store, cleanup: () => dropSchemas(schema) };
}

export const postgres: StoreFactory = {
  name: 'postgres',
  atomic: true,
  available: hasPostgres,
  open: () => openPostgres(PG_URL),
};

/** The PostgreSQL store through a pgbouncer of its own in transaction pooling mode. */
export const postgresBehindPgBouncer: StoreFactory = {
  name: 'postgres behind PgBouncer',
  atomic: true,
  available: hasPostgres && hasPgBouncer,
  async open() {
    const bouncer = await startPgBouncer({ poolSize: 3 });
    const { store, cleanup } = await openPostgres(bouncer.url, { pooling: 'transaction' });
    return {
      store,
      async cleanup() {
        await cleanup();
        await bouncer.stop();
      },
    };
  },
};

export const mysql: StoreFactory = {
  name: 'mysql',
  atomic: true,
  available: hasMysql,
  async open() {
    const database = await mysqlDatabase();
    const store = mysqlStore({ url: database.url });
    await store.migrate();
    return { store, cleanup: database.drop };
  },
};

export const redis: StoreFactory = {
  name: 'redis',
  available: hasRedis,
  async open() {
    const prefix = `${uniqueName('rs_adapter')}:`;
    return {
      store: redisStore({ url: REDIS_URL, prefix }),
      cleanup: () => deleteRedisKeys(prefix),
    };
  },
};
