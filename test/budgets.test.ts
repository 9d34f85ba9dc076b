import { mkdtempSync, rmSync } from 'node:fs';
import { IncomingMessage, ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Duplex } from 'node:stream';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { idempotency } from '../src/adapters/node.js';
import type { IdempotencyStore } from '../src/core/index.js';
import { memoryStore } from '../src/stores/memory.js';
import { postgresStore } from '../src/stores/postgres/index.js';
import { redisStore } from '../src/stores/redis.js';
import { sqliteStore } from '../src/stores/sqlite.js';
import { countTurns, type PromiseTurns } from './support/promise-turns.js';
import { hasPostgres, hasRedis, PG_URL, REDIS_URL, uniqueName } from './support/services.js';

// Microtask budgets of one keyed request through the node adapter, per store, mode and path:
// promises created and reaction jobs run, counted with a PromiseHook (deterministic, unlike time).
// A change that adds a turn to a path fails here; one that removes turns lowers the budget.
// Figures are the counts measured on Node 20; every Node line must stay within them.

type Path = 'fresh' | 'replay' | 'mismatch' | 'in_progress';
const PATHS: Path[] = ['fresh', 'replay', 'mismatch', 'in_progress'];

const BODY = Buffer.from('{"member":"U-1001","isbn":"K-01","issuedAt":"2026-11-29"}');
const OTHER_BODY = Buffer.from('{"member":"U-1001","isbn":"K-02","issuedAt":"2026-11-29"}');
const ANSWER = '{"id":1,"member":"U-1001","isbn":"K-01","issuedAt":"2026-11-29"}';

/** A socket that never closes and discards what is written to it. */
const sink = () =>
  new Duplex({
    read() {},
    write: (_chunk, _encoding, done) => done(),
    writev: (_chunks, done) => done(),
  });

/** One fully received POST /loans on real node:http objects; resolves with the status sent. */
function exchange(serve: (req: IncomingMessage, res: ServerResponse) => unknown, key: string, body = BODY) {
  const socket = sink();
  const req = new IncomingMessage(socket as never);
  req.method = 'POST';
  req.url = '/loans';
  req.rawHeaders = ['Content-Type', 'application/json', 'Idempotency-Key', key];
  req.headers = { 'content-type': 'application/json', 'idempotency-key': key };
  req.push(body);
  req.push(null);
  req.complete = true;
  const res = new ServerResponse(req);
  res.assignSocket(socket as never);
  return new Promise<number>((resolve) => {
    const done = () => resolve(res.statusCode);
    res.once('finish', done);
    res.once('close', done);
    serve(req, res);
  });
}

interface Case {
  name: string;
  mode: 'lease' | 'atomic';
  available: boolean;
  open: () => Promise<{ store: IdempotencyStore; close: () => Promise<void> }>;
}

const dir = mkdtempSync(join(tmpdir(), 'rs-budgets-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function sqliteCase(mode: 'lease' | 'atomic'): Case {
  return {
    name: 'sqlite',
    mode,
    available: true,
    open: async () => {
      const store = sqliteStore({ filename: join(dir, `${mode}.db`) });
      return { store, close: () => store.close() };
    },
  };
}

function postgresCase(mode: 'lease' | 'atomic'): Case {
  return {
    name: 'postgres',
    mode,
    available: hasPostgres,
    open: async () => {
      const schema = uniqueName('rs_budget');
      const store = postgresStore({ connectionString: PG_URL, schema });
      await store.migrate();
      return {
        store,
        close: async () => {
          await store.close();
          const admin = new pg.Client({ connectionString: PG_URL });
          await admin.connect();
          await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
          await admin.end();
        },
      };
    },
  };
}

const CASES: Case[] = [
  {
    name: 'memory',
    mode: 'lease',
    available: true,
    open: async () => {
      const store = memoryStore();
      return { store, close: () => store.close() };
    },
  },
  sqliteCase('lease'),
  sqliteCase('atomic'),
  postgresCase('lease'),
  postgresCase('atomic'),
  {
    name: 'redis',
    mode: 'lease',
    available: hasRedis,
    open: async () => {
      const store = redisStore({ url: REDIS_URL, prefix: `${uniqueName('rs_budget')}:` });
      return { store, close: () => store.close() };
    },
  },
];

/**
 * Counts each path three times after a warm-up. Over a network a reply can arrive split or late,
 * which costs a turn the code did not ask for: the least of the three is the path's own count.
 */
async function measure(store: IdempotencyStore, mode: 'lease' | 'atomic') {
  const guard = idempotency({ store, mode, concurrency: 'reject' });
  // The in-progress path's original parks in the handler until `release` is called.
  let holding = false;
  let release: (() => void) | undefined;
  const serve = guard(async (_req, res) => {
    if (holding) await new Promise<void>((resolve) => (release = resolve));
    res.writeHead(201, { 'content-type': 'application/json; charset=utf-8', location: '/loans/1' });
    res.end(ANSWER);
  });
  let n = 0;
  const keyed = async (path: Path): Promise<{ status: number; turns: PromiseTurns }> => {
    const key = `budget-${path}-${n++}`;
    let parked: Promise<number> | undefined;
    if (path !== 'fresh' && path !== 'in_progress') await exchange(serve, key);
    if (path === 'in_progress') {
      holding = true;
      parked = exchange(serve, key);
      // Let the original claim its key and park in the handler.
      for (let i = 0; i < 100 && !release; i++) await new Promise((r) => setTimeout(r, 10));
      expect(release).toBeDefined();
    }
    await new Promise((resolve) => setImmediate(resolve));
    let status = 0;
    const turns = await countTurns(async () => {
      status = await exchange(serve, key, path === 'mismatch' ? OTHER_BODY : BODY);
      await new Promise((resolve) => setImmediate(resolve));
    });
    if (parked) {
      holding = false;
      release?.();
      release = undefined;
      await parked;
    }
    return { status, turns };
  };
  for (const path of PATHS) await keyed(path); // warm-up
  const result: Record<string, { status: number; turns: PromiseTurns }[]> = {};
  for (const path of PATHS) result[path] = [await keyed(path), await keyed(path), await keyed(path)];
  return result;
}

/**
 * [promises, reactions] per path; the status each path answers is checked too. The claim loop
 * shared by HTTP requests and `idempotent()` (engine/claim-loop.ts) is an async function of its
 * own: 2 promises and 2 reactions on every path, taken knowingly.
 */
const BUDGETS: Record<string, Record<Path, [number, number]>> = {
  'memory lease': { fresh: [28, 15], replay: [18, 9], mismatch: [18, 9], in_progress: [18, 9] },
  'sqlite lease': { fresh: [34, 22], replay: [18, 9], mismatch: [18, 9], in_progress: [21, 13] },
  'sqlite atomic': { fresh: [32, 18], replay: [18, 9], mismatch: [18, 9], in_progress: [18, 9] },
  'postgres lease': { fresh: [38, 21], replay: [23, 12], mismatch: [23, 12], in_progress: [23, 12] },
  'postgres atomic': { fresh: [44, 23], replay: [38, 20], mismatch: [38, 20], in_progress: [20, 10] },
  'redis lease': { fresh: [33, 18], replay: [20, 10], mismatch: [20, 10], in_progress: [23, 12] },
};
const STATUS: Record<Path, number> = { fresh: 201, replay: 201, mismatch: 409, in_progress: 409 };

describe('microtask budgets per keyed request (node adapter)', () => {
  for (const c of CASES) {
    const name = `${c.name} ${c.mode}`;
    it.skipIf(!c.available)(`${name}: each path within its budget`, async () => {
      const { store, close } = await c.open();
      try {
        const result = await measure(store, c.mode);
        const counted = Object.fromEntries(
          PATHS.map((path) => {
            const runs = result[path]!;
            for (const run of runs) expect(run.status, `${name} ${path}`).toBe(STATUS[path]);
            return [
              path,
              [
                Math.min(...runs.map((run) => run.turns.promises)),
                Math.min(...runs.map((run) => run.turns.reactions)),
              ],
            ];
          }),
        );
        for (const path of PATHS) {
          const [promises, reactions] = counted[path] as [number, number];
          const [maxPromises, maxReactions] = BUDGETS[name]![path];
          expect(promises, `${name} ${path}: promises`).toBeLessThanOrEqual(maxPromises);
          expect(reactions, `${name} ${path}: reactions`).toBeLessThanOrEqual(maxReactions);
        }
      } finally {
        await close();
      }
    });
  }
});
