import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { type CapturedResponse, createIdempotency, type Outcome } from '../src/core/adapter.js';
import type { IdempotencyStore } from '../src/core/store.js';
import { postgresStore } from '../src/stores/postgres/index.js';
import { sqliteStore } from '../src/stores/sqlite/index.js';
import { postRequest } from '../src/testing/engine-request.js';
import { dropSchemas, hasPostgres, PG_URL, uniqueName } from './support/services.js';
import { holdSqliteWriteLock } from './support/sqlite-locker.js';

/**
 * `storeTimeout`, `wait` and `concurrency: 'reject'` on the SQL stores, in lease and atomic mode,
 * with the key table locked by another connection or a duplicate holding its key open. Each bound
 * is small (300 ms, 500 ms) against a lock or original held for LOCK_HOLD_MS, so an engine that
 * ignores a bound ends up with another outcome (the lock released, the original finished), not
 * merely a slower one.
 */

const STORE_TIMEOUT_MS = 300;
const WAIT_MS = 500;
/** How long a test lock or a held original lasts: well past every bound above. */
const LOCK_HOLD_MS = 2500;

interface SqlBackend {
  name: string;
  skip: boolean;
  open(): IdempotencyStore;
  /** Locks the key table from another connection until LOCK_HOLD_MS passes; resolves once it holds. */
  lockKeyTable(): Promise<{ released: Promise<void> }>;
  cleanup(): Promise<void>;
}

function sqliteBackend(): SqlBackend {
  const dir = mkdtempSync(path.join(tmpdir(), 'rs-bounds-'));
  const filename = path.join(dir, 'keys.db');
  return {
    name: 'SQLite',
    skip: false,
    open: () => sqliteStore({ url: filename, migrate: true }),
    lockKeyTable: () => holdSqliteWriteLock(filename, LOCK_HOLD_MS),
    async cleanup() {
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function postgresBackend(): SqlBackend {
  const schema = uniqueName('rs_bounds');
  return {
    name: 'PostgreSQL',
    skip: !hasPostgres,
    open() {
      const store = postgresStore({ url: PG_URL, schema });
      opened.push(store.migrate());
      return store;
    },
    async lockKeyTable() {
      await Promise.all(opened);
      const locker = new pg.Client({ connectionString: PG_URL });
      await locker.connect();
      await locker.query('BEGIN');
      await locker.query(`LOCK TABLE "${schema}".idempotency_keys IN EXCLUSIVE MODE`);
      const released = sleep(LOCK_HOLD_MS).then(async () => {
        await locker.query('ROLLBACK');
        await locker.end();
      });
      return { released };
    },
    async cleanup() {
      if (hasPostgres) await dropSchemas(schema);
    },
  };
}
const opened: Promise<void>[] = [];

const backends = [sqliteBackend(), postgresBackend()];
afterAll(async () => {
  for (const backend of backends) await backend.cleanup();
});

const stores: IdempotencyStore[] = [];
afterAll(async () => {
  await Promise.all(stores.map((store) => store.close()));
});

const request = (key: string) => postRequest(key, { member: 'U-1001', isbn: 'K-01' });

const created: CapturedResponse = {
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: Buffer.from('{"id":1}'),
  complete: true,
};

/** `[status, error code]` of an outcome, or its kind. */
function answer(outcome: Outcome): [number, string] | string {
  return outcome.kind === 'rejected' ? [outcome.error.status, outcome.error.code] : outcome.kind;
}

describe.each(backends)('$name store', (backend) => {
  describe.each(['lease', 'atomic'] as const)('%s mode', (mode) => {
    let keys = 0;
    const key = () => `${mode}-${++keys}-${uniqueName('k')}`;
    let store: IdempotencyStore | undefined;
    const engine = (concurrency: 'wait' | 'reject' = 'wait') => {
      if (!store) {
        store = backend.open();
        stores.push(store);
      }
      return createIdempotency({
        store,
        mode,
        concurrency,
        storeTimeout: STORE_TIMEOUT_MS,
        wait: WAIT_MS,
      });
    };

    it.skipIf(backend.skip)(
      'storeTimeout: a key table locked past it answers 503 and runs nothing',
      async () => {
        const idempotency = engine();
        const { released } = await backend.lockKeyTable();
        let runs = 0;
        const outcome = await idempotency.handle(request(key()), async () => {
          runs++;
          return created;
        });
        await released;
        expect(answer(outcome)).toEqual([503, 'store_unavailable']);
        expect(runs).toBe(0);
      },
    );

    it.skipIf(backend.skip)(
      'a claim that timed out is not left in progress: once the lock is gone the same key runs',
      async () => {
        const idempotency = engine();
        const k = key();
        const { released } = await backend.lockKeyTable();
        const run = async () => created;
        expect(answer(await idempotency.handle(request(k), run))).toEqual([503, 'store_unavailable']);
        await released;
        expect(answer(await idempotency.handle(request(k), run))).toBe('executed');
      },
    );

    for (const concurrency of ['wait', 'reject'] as const) {
      it.skipIf(backend.skip)(
        `concurrency '${concurrency}': a duplicate of an original still running answers 409 in_progress before it ends`,
        async () => {
          const idempotency = engine(concurrency);
          const k = key();
          let running = false;
          let entered!: () => void;
          const inside = new Promise<void>((resolve) => {
            entered = resolve;
          });
          let finish!: () => void;
          const gate = new Promise<void>((resolve) => {
            finish = resolve;
          });
          const original = idempotency.handle(request(k), async () => {
            running = true;
            entered();
            // Bounded: an engine that lets the duplicate wait past `wait` sees the original end.
            await Promise.race([gate, sleep(LOCK_HOLD_MS)]);
            running = false;
            return created;
          });
          await inside;
          let duplicateRan = false;
          const duplicate = await idempotency.handle(request(k), async () => {
            duplicateRan = true;
            return created;
          });
          const answeredWhileRunning = running;
          finish();
          expect(answer(duplicate)).toEqual([409, 'request_in_progress']);
          expect(duplicate.kind === 'rejected' && duplicate.error.headers['retry-after']).toMatch(/^\d+$/);
          expect(answeredWhileRunning).toBe(true);
          expect(duplicateRan).toBe(false);
          expect(answer(await original)).toBe('executed');
        },
      );
    }
  });
});
