import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { type CapturedResponse, createIdempotency, type Outcome } from '../src/core/adapter.js';
import {
  type IdempotencyContext,
  type IdempotencyEvent,
  type IdempotencyOptions,
  resumeAbandoned,
  startCompleter,
} from '../src/core/index.js';
import type { IdempotencyStore } from '../src/core/store.js';
import { memoryStore } from '../src/stores/memory.js';
import { postRequest } from '../src/testing/engine-request.js';

const created = (body: unknown): CapturedResponse => ({
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: Buffer.from(JSON.stringify(body)),
  complete: true,
});

const bodyOf = (outcome: Outcome | undefined) =>
  outcome && (outcome.kind === 'executed' || outcome.kind === 'replayed')
    ? JSON.parse(Buffer.from(outcome.response.body).toString())
    : outcome;

/** A fine paid in three steps; `runs` counts each step's executions, `crashAfter` throws after one. */
function payFine(runs: Record<string, number>, crashAfter?: string) {
  const count = (name: string) => {
    runs[name] = (runs[name] ?? 0) + 1;
  };
  return async (idem: IdempotencyContext): Promise<CapturedResponse> => {
    const fine = await idem.step('recorded', () => {
      count('recorded');
      return { id: `F-${randomUUID()}` };
    });
    if (crashAfter === 'recorded') throw new Error('crashed after recorded');
    const charge = await idem.step('charged', () => {
      count('charged');
      return { chargeId: `ch_${idem.stepKey('charged').slice(0, 8)}` };
    });
    if (crashAfter === 'charged') throw new Error('crashed after charged');
    await idem.step('paid', () => void count('paid'));
    return created({ ...fine, ...charge, status: 'paid' });
  };
}

function engineOn(store: IdempotencyStore, options: Partial<IdempotencyOptions> = {}) {
  return createIdempotency({ store, lease: 200, ...options });
}

/** Counts the store calls that write, to hold a step's save to one. */
function countingStore(store: IdempotencyStore) {
  const writes: string[] = [];
  const counted = { ...store };
  for (const name of ['claim', 'complete', 'release', 'renew', 'saveStep', 'delete'] as const) {
    const call = store[name] as (...args: unknown[]) => Promise<unknown>;
    (counted as Record<string, unknown>)[name] = (...args: unknown[]) => {
      writes.push(name);
      return call(...args);
    };
  }
  return { store: counted as IdempotencyStore, writes };
}

describe('steps (lease mode, memory store)', () => {
  it('a takeover gets the finished steps without running them and runs only the rest; a retry replays', async () => {
    const store = memoryStore();
    const engine = engineOn(store);
    const key = randomUUID();
    const runs: Record<string, number> = {};
    await expect(engine.handle(postRequest(key), payFine(runs, 'charged'))).rejects.toThrow('crashed');
    expect(runs).toEqual({ recorded: 1, charged: 1 });
    expect((await store.get('', key))?.steps).toEqual(['recorded', 'charged']);
    const done = await engine.handle(postRequest(key), payFine(runs));
    expect(done.kind).toBe('executed');
    expect(runs).toEqual({ recorded: 1, charged: 1, paid: 1 });
    const replay = await engine.handle(postRequest(key), payFine(runs));
    expect(replay.kind).toBe('replayed');
    expect(bodyOf(replay)).toEqual(bodyOf(done));
    expect(runs).toEqual({ recorded: 1, charged: 1, paid: 1 });
  });

  it("a stale owner's step save is refused: its handler stops and the request is told the key is in progress", async () => {
    const base = memoryStore();
    // No renewals: the first handler's lease passes while it runs, as a paused process's would.
    const store: IdempotencyStore = { ...base, renew: async () => true };
    const events: IdempotencyEvent[] = [];
    const engine = engineOn(store, { onEvent: (event) => events.push(event) });
    const key = randomUUID();
    let resume!: () => void;
    const paused = new Promise<void>((resolve) => (resume = resolve));
    const runs: Record<string, number> = {};
    const stale = engine.handle(postRequest(key), async (idem) => {
      await idem.step('recorded', () => 'first');
      await paused;
      await idem.step('charged', () => {
        runs.staleCharged = 1;
        return 'stale';
      });
      return created({ from: 'stale' });
    });
    await sleep(450);
    const fresh = await engine.handle(postRequest(key), payFine(runs));
    expect(fresh.kind).toBe('executed');
    expect(runs).toEqual({ charged: 1, paid: 1 });
    resume();
    const answer = await stale;
    expect(answer.kind === 'rejected' && answer.error.code).toBe('request_in_progress');
    expect(events).toContainEqual({ type: 'fenced', key, scope: '', step: 'step' });
    expect(bodyOf(await engine.handle(postRequest(key), payFine(runs)))).toEqual(bodyOf(fresh));
  });

  it('of concurrent duplicates sent while a step runs, one executes it; all get its answer', async () => {
    const store = memoryStore();
    const engine = engineOn(store, { lease: 5_000 });
    const key = randomUUID();
    let charged = 0;
    const handler = async (idem: IdempotencyContext) => {
      const charge = await idem.step('charged', async () => {
        charged++;
        await sleep(100);
        return { chargeId: randomUUID() };
      });
      return created(charge);
    };
    const outcomes = await Promise.all(
      Array.from({ length: 10 }, () => engine.handle(postRequest(key), handler)),
    );
    expect(charged).toBe(1);
    expect(outcomes.filter((outcome) => outcome.kind === 'executed')).toHaveLength(1);
    expect(new Set(outcomes.map((outcome) => JSON.stringify(bodyOf(outcome)))).size).toBe(1);
  });

  it('a step save costs one store write, and only the first carries the request', async () => {
    const { store, writes } = countingStore(memoryStore());
    const saves: (string | undefined)[] = [];
    const saveStep = store.saveStep;
    store.saveStep = (scope, key, token, step, request) => {
      saves.push(request);
      return saveStep(scope, key, token, step, request);
    };
    const engine = engineOn(store, { lease: 30_000 });
    await engine.handle(postRequest(randomUUID()), payFine({}));
    expect(writes).toEqual(['claim', 'saveStep', 'saveStep', 'saveStep', 'complete']);
    expect(saves.map((request) => request !== undefined)).toEqual([true, false, false]);
  });

  it('a step answers what a takeover would: the JSON round trip of its result', async () => {
    const engine = engineOn(memoryStore());
    let seen: unknown;
    await engine.handle(postRequest(randomUUID()), async (idem) => {
      seen = [
        await idem.step('date', () => new Date(0).toISOString()),
        await idem.step('nothing', () => undefined),
      ];
      return created({});
    });
    expect(seen).toEqual(['1970-01-01T00:00:00.000Z', undefined]);
  });

  it('keeps the key (lease ended) when the handler fails after a step, so the retry resumes there', async () => {
    const store = memoryStore();
    const engine = engineOn(store);
    const key = randomUUID();
    const runs: Record<string, number> = {};
    await expect(engine.handle(postRequest(key), payFine(runs, 'recorded'))).rejects.toThrow();
    const record = await store.get('', key);
    expect(record?.state).toBe('in_progress');
    expect(record!.leaseUntilMs!).toBeLessThanOrEqual(Date.now() + 5);
    await engine.handle(postRequest(key), payFine(runs));
    expect(runs).toEqual({ recorded: 1, charged: 1, paid: 1 });
  });

  it('ends the lease after a renewal still on its way, which would otherwise hold the key another lease', async () => {
    const base = memoryStore();
    // Renewals take 100 ms to reach the store; ending the lease (1 ms) does not.
    const store: IdempotencyStore = {
      ...base,
      renew: async (scope, key, token, leaseMs) => {
        if (leaseMs > 1) await sleep(100);
        return base.renew(scope, key, token, leaseMs);
      },
    };
    const engine = engineOn(store, { lease: 300 });
    const key = randomUUID();
    await expect(
      engine.handle(postRequest(key), async (idem) => {
        await idem.step('recorded', () => 1);
        await sleep(130); // the first renewal (due at 100 ms) is on its way
        throw new Error('provider down');
      }),
    ).rejects.toThrow();
    await sleep(150);
    const record = await base.get('', key);
    expect(record!.leaseUntilMs!).toBeLessThanOrEqual(Date.now());
  });

  it('with encryptionKey, step results and the saved request are sealed at rest', async () => {
    const store = memoryStore();
    const engine = engineOn(store, { encryptionKey: randomBytes(32) });
    const key = randomUUID();
    await expect(
      engine.handle(postRequest(key, { member: 'U-secret' }), async (idem) => {
        await idem.step('recorded', () => ({ card: '4242-secret' }));
        throw new Error('crash');
      }),
    ).rejects.toThrow();
    // The failed handler ended its lease (1 ms): the record is abandoned once that passes.
    await sleep(5);
    const [abandoned] = await store.abandoned();
    expect(abandoned?.request).not.toContain('secret');
    expect(Buffer.from(abandoned!.request.slice('sealed:'.length), 'base64').toString()).not.toContain(
      'secret',
    );
    const claimed = await store.claim({
      scope: '',
      key,
      fingerprint: abandoned!.fingerprint,
      leaseMs: 1,
      retainMs: 60_000,
    });
    expect(claimed.outcome === 'acquired' && JSON.stringify(claimed.steps)).not.toContain('secret');
  });

  it('names: empty or very long names, a name already running and a name already finished are refused', async () => {
    const engine = engineOn(memoryStore());
    const errors: unknown[] = [];
    await engine.handle(postRequest(randomUUID()), async (idem) => {
      for (const attempt of [() => idem.step('', () => 1), () => idem.step('x'.repeat(201), () => 1)]) {
        await attempt().catch((error) => errors.push(error));
      }
      const slow = idem.step('slow', () => sleep(20).then(() => 1));
      await idem.step('slow', () => 2).catch((error) => errors.push(error));
      expect(await slow).toBe(1);
      await idem.step('slow', () => 3).catch((error) => errors.push(error));
      return created({});
    });
    expect(errors.map((error) => (error as Error).name)).toEqual([
      'ConfigError',
      'ConfigError',
      'ConfigError',
      'ConfigError',
    ]);
  });
});

describe('the completer', () => {
  it('finishes an abandoned operation from its saved request; a late retry replays its answer', async () => {
    const store = memoryStore();
    const events: IdempotencyEvent[] = [];
    const engine = engineOn(store, { onEvent: (event) => events.push(event) });
    const key = randomUUID();
    const runs: Record<string, number> = {};
    const requests: unknown[] = [];
    await expect(
      engine.handle(postRequest(key, { member: 'U-7' }), payFine(runs, 'charged')),
    ).rejects.toThrow();
    await sleep(5);
    const resumed = await resumeAbandoned({
      store,
      resume: (record) =>
        engine.resume(record, (idem, request) => {
          requests.push({ ...request, body: JSON.parse(Buffer.from(request.body).toString()) });
          return payFine(runs)(idem);
        }),
    });
    expect(resumed).toBe(1);
    expect(runs).toEqual({ recorded: 1, charged: 1, paid: 1 });
    expect(requests).toEqual([
      {
        method: 'POST',
        path: '/loans',
        contentType: 'application/json',
        body: { member: 'U-7' },
        scope: '',
        key,
      },
    ]);
    expect(events).toContainEqual({ type: 'resumed', key, scope: '', finishedSteps: 2 });
    expect(events.filter((event) => event.type === 'step_replayed').map((event) => event.name)).toEqual([
      'recorded',
      'charged',
    ]);
    const late = await engine.handle(postRequest(key, { member: 'U-7' }), payFine(runs));
    expect(late.kind).toBe('replayed');
    expect(bodyOf(late)).toMatchObject({ status: 'paid' });
    expect(await store.abandoned()).toEqual([]);
  });

  it('many completers at once finish the operation once', async () => {
    const store = memoryStore();
    const engines = Array.from({ length: 5 }, () => engineOn(store, { lease: 2_000 }));
    const key = randomUUID();
    const runs: Record<string, number> = {};
    await expect(engines[0]!.handle(postRequest(key), payFine(runs, 'recorded'))).rejects.toThrow();
    await sleep(5);
    const outcomes: (Outcome | undefined)[] = [];
    await Promise.all(
      engines.map((engine) =>
        resumeAbandoned({
          store,
          resume: async (record) => {
            outcomes.push(
              await engine.resume(record, async (idem) => {
                await sleep(50);
                return payFine(runs)(idem);
              }),
            );
          },
        }),
      ),
    );
    expect(runs).toEqual({ recorded: 1, charged: 1, paid: 1 });
    expect(outcomes.filter((outcome) => outcome?.kind === 'executed')).toHaveLength(1);
  });

  it('says so when the key that sealed an operation was dropped: an event, and replay_unreadable to a retry', async () => {
    const store = memoryStore();
    const key = randomUUID();
    const runs: Record<string, number> = {};
    await expect(
      engineOn(store, { encryptionKey: randomBytes(32) }).handle(postRequest(key), payFine(runs, 'recorded')),
    ).rejects.toThrow();
    await sleep(5);
    const events: IdempotencyEvent[] = [];
    const other = engineOn(store, { encryptionKey: randomBytes(32), onEvent: (event) => events.push(event) });
    const [record] = await store.abandoned();
    const resumed = await other.resume(record!, payFine(runs));
    expect(resumed?.kind === 'rejected' && resumed.error.code).toBe('replay_unreadable');
    expect(events).toEqual([{ type: 'rejected', reason: 'replay_unreadable', key, scope: '' }]);
    expect((await store.get('', key))?.state).toBe('in_progress');
    // A retry is answered as an unreadable replay is (500 replay_unreadable), its steps kept.
    const retry = await other.handle(postRequest(key), payFine(runs));
    expect(retry.kind === 'rejected' && [retry.error.status, retry.error.code]).toEqual([
      500,
      'replay_unreadable',
    ]);
    expect(events.filter((event) => event.type === 'rejected')).toHaveLength(2);
    expect(runs).toEqual({ recorded: 1 });
    expect((await store.get('', key))?.steps).toEqual(['recorded']);
  });
});

describe('issue 32: step names and step values', () => {
  it('a step name reused within one execution is an error naming the step; a takeover replays it once', async () => {
    const store = memoryStore();
    const engine = engineOn(store);
    const key = randomUUID();
    const charged: string[] = [];
    const loop = async (idem: IdempotencyContext) => {
      const items = [];
      for (const item of ['book', 'dvd', 'map']) {
        items.push(
          await idem.step('charge', () => {
            charged.push(item);
            return item;
          }),
        );
      }
      return created(items);
    };
    await expect(engine.handle(postRequest(key), loop)).rejects.toThrow(/step 'charge'.*already/);
    expect(charged).toEqual(['book']);
    // The takeover replays the finished step once, then meets the same reuse.
    await sleep(5);
    const resumed = engine.handle(postRequest(key), async (idem) => {
      expect(await idem.step('charge', () => 'again')).toBe('book');
      return created({ ok: true });
    });
    expect(bodyOf(await resumed)).toEqual({ ok: true });
    expect(charged).toEqual(['book']);
  });

  it('in atomic steps too, a name reused is an error', async () => {
    const { atomicSteps } = await import('../src/core/engine/steps.js');
    const steps = atomicSteps(undefined);
    await steps.step('a', () => 1);
    await expect(steps.step('a', () => 2)).rejects.toThrow(/step 'a'/);
  });

  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  it.each<[string, () => unknown]>([
    ['a BigInt', () => 10n],
    ['a cyclic object', () => cyclic],
    ['a function', () => () => 1],
    ['a Symbol', () => Symbol('x')],
    ['NaN', () => ({ amount: Number.NaN })],
    ['a Map', () => new Map([['a', 1]])],
    ['more than maxStepBytes', () => 'x'.repeat(2_000)],
  ])(
    'a step value that is %s fails loudly before anything is saved; the operation stays resumable',
    async (_what, value) => {
      const store = memoryStore();
      const engine = engineOn(store, { maxStepBytes: 1_000 });
      const key = randomUUID();
      const outcome = engine.handle(postRequest(key), async (idem) => {
        await idem.step('recorded', () => 'fine');
        await idem.step('charged', value);
        return created({});
      });
      await expect(outcome).rejects.toThrow(/step 'charged'/);
      expect((await store.get('', key))?.steps).toEqual(['recorded']);
      await sleep(5);
      const done = await engine.handle(postRequest(key), async (idem) => {
        const fine = await idem.step('recorded', () => 'again');
        return created({ fine, charge: await idem.step('charged', () => 'ch_1') });
      });
      expect(bodyOf(done)).toEqual({ fine: 'fine', charge: 'ch_1' });
    },
  );

  it('maxStepBytes is checked at construction', () => {
    expect(() => engineOn(memoryStore(), { maxStepBytes: 0 })).toThrow(/maxStepBytes/);
  });
});

describe('issue 32: the completer under a hung resume', () => {
  it('one hung resume neither blocks the others nor stop(); its lease is ended for a later pass', async () => {
    const store = memoryStore();
    const engine = engineOn(store, { lease: 100 });
    const keys = Array.from({ length: 4 }, () => randomUUID());
    for (const key of keys) {
      await expect(engine.handle(postRequest(key), payFine({}, 'recorded'))).rejects.toThrow();
    }
    const [hung, ...others] = keys as [string, ...string[]];
    await sleep(5);
    // The hung record comes first: its lease passed first.
    expect((await store.abandoned()).map((record) => record.key)[0]).toBe(hung);
    const errors: unknown[] = [];
    const completer = startCompleter({
      store,
      interval: 20,
      resumeTimeout: 300,
      onError: (error) => errors.push(error),
      resume: (record, signal) =>
        engine.resume(
          record,
          (idem) => (record.key === hung ? new Promise<CapturedResponse>(() => {}) : payFine({})(idem)),
          signal,
        ),
    });
    for (let tries = 0; tries < 400; tries++) {
      const states = await Promise.all(others.map((key) => store.get('', key)));
      if (states.every((record) => record?.state === 'completed')) break;
      await sleep(25);
    }
    expect((await Promise.all(others.map((key) => store.get('', key)))).map((r) => r?.state)).toEqual([
      'completed',
      'completed',
      'completed',
    ]);
    await completer.stop();
    expect(String(errors[0])).toContain(`resume of key ${hung} did not settle`);
    // Given up, its lease was ended (not renewed by the hung handler): a later pass takes it over.
    await sleep(5);
    expect((await store.abandoned()).map((record) => record.key)).toContain(hung);
  });

  it('stop() returns while a resume hangs', async () => {
    const store = memoryStore();
    const engine = engineOn(store, { lease: 100 });
    const key = randomUUID();
    await expect(engine.handle(postRequest(key), payFine({}, 'recorded'))).rejects.toThrow();
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    const completer = startCompleter({
      store,
      interval: 10,
      resume: () => {
        started();
        return new Promise(() => {});
      },
    });
    await running;
    await completer.stop();
  });
});

describe('issue 32: an operation that keeps failing ends', () => {
  it("a handler's final 4xx after a step ends the operation: saved, replayed, the step not run again", async () => {
    const store = memoryStore();
    const engine = engineOn(store);
    const key = randomUUID();
    let charged = 0;
    const handler = async (idem: IdempotencyContext): Promise<CapturedResponse> => {
      await idem.step('charged', () => ++charged);
      return { ...created({ error: 'validation', field: 'member' }), status: 422 };
    };
    const first = await engine.handle(postRequest(key), handler);
    expect(first.kind === 'executed' && first.response.status).toBe(422);
    expect((await store.get('', key))?.state).toBe('completed');
    const retry = await engine.handle(postRequest(key), handler);
    expect(retry.kind === 'replayed' && retry.response.status).toBe(422);
    expect(charged).toBe(1);
    expect(await store.abandoned()).toEqual([]);
  });

  it('a 4xx before any step still frees the key for the corrected request', async () => {
    const store = memoryStore();
    const engine = engineOn(store);
    const key = randomUUID();
    await engine.handle(postRequest(key), async () => ({ ...created({}), status: 422 }));
    expect(await store.get('', key)).toBeUndefined();
  });

  it('the completer gives up after maxResumes: a final answer saved, an event, and retries replay it', async () => {
    const store = memoryStore();
    const events: IdempotencyEvent[] = [];
    const engine = engineOn(store, { maxResumes: 2, onEvent: (event) => events.push(event) });
    const key = randomUUID();
    const runs: Record<string, number> = {};
    await expect(engine.handle(postRequest(key), payFine(runs, 'recorded'))).rejects.toThrow();
    const outcomes: (Outcome | undefined)[] = [];
    const errors: unknown[] = [];
    for (let pass = 0; pass < 4; pass++) {
      await sleep(5);
      await resumeAbandoned({
        store,
        onError: (error) => errors.push(error),
        resume: async (record, signal) =>
          outcomes.push(await engine.resume(record, payFine(runs, 'recorded'), signal)),
      });
    }
    // Two resumes ran the handler (and failed); the third recorded the final answer; none after.
    expect(runs).toEqual({ recorded: 1 });
    expect(errors.map(String)).toEqual(['Error: crashed after recorded', 'Error: crashed after recorded']);
    expect(outcomes).toHaveLength(1);
    const final = outcomes[0];
    expect(final?.kind === 'rejected' && [final.error.status, final.error.code]).toEqual([
      500,
      'operation_abandoned',
    ]);
    expect(events).toContainEqual({ type: 'gave_up', key, scope: '', resumes: 2 });
    expect((await store.get('', key))?.state).toBe('completed');
    const retry = await engine.handle(postRequest(key), payFine(runs));
    expect(retry.kind === 'replayed' && retry.response.status).toBe(500);
    expect(bodyOf(retry)).toMatchObject({ error: 'operation_abandoned' });
    expect(runs).toEqual({ recorded: 1 });
  });

  it('maxResumes is checked at construction, and step names starting with retrysafe: are the engine’s', async () => {
    expect(() => engineOn(memoryStore(), { maxResumes: 0 })).toThrow(/maxResumes/);
    const engine = engineOn(memoryStore());
    await expect(
      engine.handle(postRequest(randomUUID()), async (idem) => {
        await idem.step('retrysafe:resume:1', () => 1);
        return created({});
      }),
    ).rejects.toThrow(/retrysafe:/);
  });
});
