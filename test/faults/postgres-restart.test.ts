import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ClaimInput, StoredResponse } from '../../src/core/contract/index.js';
import { type PostgresStore, postgresStore } from '../../src/stores/postgres/index.js';
import { databaseUp, pgctl } from '../support/postgres-cluster.js';
import { hasPostgres, PG_URL, uniqueName } from '../support/services.js';
import { expectWaitWokenBy } from '../support/store-calls.js';

/** The bound on "promptly" this test holds every store call to while the database is down. */
const HANG_BOUND_MS = 5000;
/** How long the store gets to recover by itself once the database is back. */
const RECOVERY_BOUND_MS = 20_000;

type Outcome = 'ok' | 'error' | 'hung';

async function bounded(call: () => Promise<unknown>): Promise<Outcome> {
  let timer: NodeJS.Timeout | undefined;
  const outcome = await Promise.race<Outcome>([
    call().then(
      () => 'ok',
      (error: unknown) => {
        expect(error).toBeInstanceOf(Error);
        return 'error';
      },
    ),
    new Promise<Outcome>((resolve) => {
      timer = setTimeout(() => resolve('hung'), HANG_BOUND_MS);
    }),
  ]);
  clearTimeout(timer);
  return outcome;
}

describe.skipIf(!hasPostgres)('postgres store while the cluster restarts', () => {
  const schema = uniqueName('rs_pg_fault');
  let store: PostgresStore;
  const response: StoredResponse = { status: 201, headers: {}, body: new TextEncoder().encode('ok') };
  let sequence = 0;
  const input = (): ClaimInput => ({
    scope: 'fault',
    key: `k-${sequence++}`,
    fingerprint: 'fp',
    leaseMs: 10_000,
    retainMs: 60_000,
  });

  /** One request's worth of store calls, in lease mode or atomic mode. */
  async function operation(atomic: boolean): Promise<void> {
    const claim = input();
    if (atomic) {
      const result = await store.atomic(claim, async (tx) => {
        await tx.query('SELECT 1');
        return { response, commit: true };
      });
      if (result.outcome !== 'executed') throw new Error(`unexpected ${result.outcome}`);
      return;
    }
    const result = await store.claim(claim);
    if (result.outcome !== 'acquired') throw new Error(`unexpected ${result.outcome}`);
    await store.complete(claim.scope, claim.key, result.token, response);
  }

  beforeAll(async () => {
    store = postgresStore({ url: PG_URL, schema, connectTimeoutMs: 2000 });
    await store.migrate();
  });

  afterAll(async () => {
    // Whatever happened above, leave the shared cluster running.
    if (!(await databaseUp())) await pgctl('start');
    await store?.close();
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.end();
  });

  it('calls during the outage reject promptly; the store recovers by itself; nothing crashes', async () => {
    await operation(false);
    await operation(true);
    // A waiter parked on an in-progress key when the cluster goes down.
    const parked = input();
    const parkedClaim = await store.claim(parked);
    expect(parkedClaim.outcome).toBe('acquired');
    const parkedWait = bounded(() => store.wait(parked.scope, parked.key, 60_000));

    const outcomes: Outcome[] = [];
    let restarting = true;
    const restart = pgctl('restart').finally(() => {
      restarting = false;
    });
    const flows = [false, true].map(async (atomic) => {
      while (restarting) {
        outcomes.push(await bounded(() => operation(atomic)));
        await sleep(20);
      }
    });
    await Promise.all([restart, ...flows]);

    expect(outcomes).not.toContain('hung');
    expect(outcomes).toContain('error');
    expect(await parkedWait).not.toBe('hung');

    const deadline = Date.now() + RECOVERY_BOUND_MS;
    const recovered = { lease: false, atomic: false };
    while (Date.now() < deadline && !(recovered.lease && recovered.atomic)) {
      recovered.lease ||= (await bounded(() => operation(false))) === 'ok';
      recovered.atomic ||= (await bounded(() => operation(true))) === 'ok';
      await sleep(100);
    }
    expect(recovered).toEqual({ lease: true, atomic: true });

    // LISTEN/NOTIFY (or its polling fallback) works again after the listener's connection died.
    const after = input();
    const claimed = await store.claim(after);
    if (claimed.outcome !== 'acquired') throw new Error(claimed.outcome);
    await expectWaitWokenBy(
      store,
      after.scope,
      after.key,
      async () => expect(await store.complete(after.scope, after.key, claimed.token, response)).toBe(true),
      { timeoutMs: 60_000 },
    );
  });
});
