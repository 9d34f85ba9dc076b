import { setImmediate as nextTurn } from 'node:timers/promises';
import type {
  AtomicResult,
  AtomicStore,
  AtomicWorkResult,
  ClaimInput,
  ClaimResult,
  IdempotencyStore,
  PhaseStore,
} from '../core/store.js';
import { memoryStore } from '../stores/memory.js';
import { type SqliteDatabase, sqliteStore } from '../stores/sqlite/index.js';
import type { StoreUnderTest } from './store-suite.js';

/**
 * A deliberately broken store: {@link describeStoreConformance} must fail against it (at least
 * one of its tests), or the suite has a hole a real store's bug could slip through.
 */
export interface MutationProbe {
  /** A short kebab-case name, `claim-read-then-write`. */
  name: string;
  /** What the store gets wrong. */
  breaks: string;
  /** Opens a fresh broken store, as the suite's `setup` does. */
  open(): Promise<StoreUnderTest>;
}

const idOf = (scope: string, key: string) => JSON.stringify([scope, key]);

/** `store` answering with `overrides` where given, its own methods (and `atomic`, `phase`) elsewhere. */
function overriding<S extends IdempotencyStore>(store: S, overrides: Partial<AtomicStore & PhaseStore>): S {
  return new Proxy(store, {
    get: (target, property, receiver) =>
      Object.hasOwn(overrides, property)
        ? overrides[property as keyof typeof overrides]
        : Reflect.get(target, property, receiver),
  });
}

/**
 * The token of the latest acquired claim of each key, as a store keeps it on the record: what a
 * fencing condition that forgot the caller's token (`WHERE key = ?`) writes under anyway.
 */
function ownerTokens(store: IdempotencyStore) {
  const tokens = new Map<string, string>();
  return {
    async claim(input: ClaimInput): Promise<ClaimResult> {
      const result = await store.claim(input);
      if (result.outcome === 'acquired') tokens.set(idOf(input.scope, input.key), result.token);
      return result;
    },
    owner: (scope: string, key: string, given: string) => tokens.get(idOf(scope, key)) ?? given,
  };
}

/** A SQLite store in memory with a table for the atomic-mode and phase tests to write to. */
function sqliteUnderTest() {
  const store = sqliteStore({ url: ':memory:', migrate: true });
  store.database.exec('CREATE TABLE probe (id INTEGER PRIMARY KEY)');
  return {
    store,
    atomicProbe: {
      write: (db: SqliteDatabase) => void db.prepare('INSERT INTO probe DEFAULT VALUES').run(),
      count: async () => (store.database.prepare('SELECT count(*) AS n FROM probe').get() as { n: number }).n,
      commit: (db: SqliteDatabase) => void db.exec('COMMIT'),
    },
  };
}

/** A probe over a fresh memory store, its methods replaced by what `broken` makes of it. */
function overMemory(
  name: string,
  breaks: string,
  broken: (store: IdempotencyStore) => Partial<AtomicStore & PhaseStore>,
): MutationProbe {
  return {
    name,
    breaks,
    async open() {
      const store = memoryStore();
      return { store: overriding(store, broken(store)) };
    },
  };
}

/** A probe whose fenced write `method` runs under the record's current owner, whoever calls it. */
function unfenced(
  name: string,
  method: 'complete' | 'release' | 'renew' | 'saveStep',
  breaks: string,
): MutationProbe {
  return overMemory(name, breaks, (store) => {
    const { claim, owner } = ownerTokens(store);
    const write = store[method] as (scope: string, key: string, token: string, ...rest: never[]) => unknown;
    return {
      claim,
      [method]: (scope: string, key: string, token: string, ...rest: never[]) =>
        write(scope, key, owner(scope, key, token), ...rest),
    };
  });
}

/** The stores the probes break, unbroken: the suite passes on each (the probes' control). */
export const probeBases = {
  memory: async (): Promise<StoreUnderTest> => ({ store: memoryStore() }),
  sqlite: async (): Promise<StoreUnderTest> => sqliteUnderTest(),
};

/** Thrown out of a phase to roll back work that answered `commit: false`. */
const ROLL_BACK = Symbol('roll back');

/**
 * Deliberately broken stores, one per way a store can break the contract, each caught by
 * {@link describeStoreConformance}: over the memory store, or over SQLite (in memory, through
 * better-sqlite3 or node:sqlite) where the breakage needs a transaction.
 *
 * @example
 * ```ts
 * import { describeStoreConformance, mutationProbes } from 'retrysafe/testing';
 * // Run in a file of its own, expecting failures: each probe must fail at least one test.
 * for (const probe of mutationProbes) describeStoreConformance(probe.name, probe.open);
 * ```
 */
export const mutationProbes: readonly MutationProbe[] = [
  overMemory(
    'claim-read-then-write',
    'claims by reading the key, then writing over what it read as absent: a race lets two acquire',
    (store) => ({
      async claim(input) {
        const seen = await store.get(input.scope, input.key);
        await nextTurn();
        if (seen === undefined) await store.delete(input.scope, input.key);
        return store.claim(input);
      },
    }),
  ),
  unfenced('complete-without-token', 'complete', "completes a record whatever the caller's token"),
  unfenced('release-ignoring-token', 'release', "releases a record whatever the caller's token"),
  unfenced(
    'renew-reviving-taken-lease',
    'renew',
    "renews a lease whatever the caller's token: a stale owner extends the lease another owner took",
  ),
  unfenced('save-step-unfenced', 'saveStep', "saves a step whatever the caller's token"),
  overMemory(
    'purge-deleting-live-lease',
    "purges by the claim's retention alone, deleting a record whose lease was renewed past it",
    (store) => {
      const retention = new Map<string, { scope: string; key: string; expiresAtMs: number }>();
      return {
        async claim(input) {
          const result = await store.claim(input);
          const id = idOf(input.scope, input.key);
          if (result.outcome === 'acquired' && !retention.has(id)) {
            retention.set(id, {
              scope: input.scope,
              key: input.key,
              expiresAtMs: Date.now() + input.retainMs,
            });
          }
          return result;
        },
        async purgeExpired(batchSize) {
          let deleted = 0;
          for (const [id, record] of retention) {
            if (record.expiresAtMs > Date.now()) continue;
            retention.delete(id);
            if (await store.delete(record.scope, record.key)) deleted++;
          }
          return deleted + (await store.purgeExpired(batchSize));
        },
      };
    },
  ),
  overMemory('list-other-scopes', "lists every scope's records when asked for one scope", (store) => ({
    list: ({ scope: _ignored, ...options } = {}) => store.list(options),
  })),
  overMemory(
    'release-dropping-steps',
    'drops the finished steps when an owner lets go by ending its lease (renew to 1 ms, how the engine releases an operation with steps): the takeover runs them again',
    (store) => {
      // How many of a record's steps the broken renew lost: the view hides that many.
      const lost = new Map<string, number>();
      const kept = <T>(scope: string, key: string, steps: readonly T[] | undefined) =>
        steps?.slice(lost.get(idOf(scope, key)) ?? 0);
      return {
        async renew(scope, key, token, leaseMs) {
          const steps = (await store.get(scope, key))?.steps?.length ?? 0;
          const renewed = await store.renew(scope, key, token, leaseMs);
          if (renewed) lost.set(idOf(scope, key), steps);
          return renewed;
        },
        async claim(input) {
          const result = await store.claim(input);
          if (result.outcome !== 'acquired') return result;
          return { ...result, steps: kept(input.scope, input.key, result.steps) };
        },
        async get(scope, key, options) {
          const record = await store.get(scope, key, options);
          if (!record?.steps) return record;
          const { steps, ...rest } = record;
          const left = kept(scope, key, steps);
          return left?.length ? { ...rest, steps: left } : rest;
        },
      };
    },
  ),
  overMemory(
    'abandoned-wrong-operation',
    "hands the completer a key's first operation (its fingerprint and saved request), not the one that holds the key now",
    (store) => {
      const first = new Map<string, { fingerprint: string; request: string }>();
      const fingerprints = new Map<string, string>();
      return {
        async claim(input) {
          const result = await store.claim(input);
          if (result.outcome === 'acquired')
            fingerprints.set(idOf(input.scope, input.key), input.fingerprint);
          return result;
        },
        async saveStep(scope, key, token, step, request) {
          const saved = await store.saveStep(scope, key, token, step, request);
          const id = idOf(scope, key);
          if (saved && request !== undefined && !first.has(id)) {
            first.set(id, { fingerprint: fingerprints.get(id) ?? '', request });
          }
          return saved;
        },
        async abandoned(options) {
          return (await store.abandoned(options)).map((record) => ({
            ...record,
            ...first.get(idOf(record.scope, record.key)),
          }));
        },
      };
    },
  ),
  {
    name: 'phase-after-takeover',
    breaks:
      "runs and commits a phase whatever the caller's token: a dead owner's phase lands after the takeover",
    async open() {
      const subject = sqliteUnderTest();
      const { claim, owner } = ownerTokens(subject.store);
      return {
        ...subject,
        store: overriding(subject.store, {
          claim,
          phase: (scope, key, token, work, request) =>
            subject.store.phase(scope, key, owner(scope, key, token), work, request),
        }),
      };
    },
  },
  {
    name: 'atomic-claim-before-work',
    breaks:
      "atomic mode commits the claim on its own, before the work's transaction: a failed or rolled-back work leaves the key claimed",
    async open() {
      const subject = sqliteUnderTest();
      const { store } = subject;
      async function atomic(
        input: ClaimInput,
        work: (tx: unknown) => Promise<AtomicWorkResult>,
      ): Promise<AtomicResult> {
        const claimed = await store.claim(input);
        if (claimed.outcome !== 'acquired') return claimed;
        let result: AtomicWorkResult | undefined;
        try {
          await store.phase(input.scope, input.key, claimed.token, async (tx) => {
            result = await work(tx);
            if (!result.commit) throw ROLL_BACK;
            return { name: 'work', value: 'null' };
          });
        } catch (error) {
          if (error !== ROLL_BACK) throw error;
        }
        const { response, commit } = result!;
        if (commit) await store.complete(input.scope, input.key, claimed.token, response);
        return { outcome: 'executed', response, committed: commit };
      }
      return { ...subject, store: overriding(store, { atomic }) };
    },
  },
];
