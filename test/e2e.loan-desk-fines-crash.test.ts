import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  expectChargedOnce,
  FINE_DATABASES,
  firstFinePaid,
  listFines,
  type Provider,
  postFine,
  startPaymentProvider,
} from './support/fines.js';
import { describeEachDatabase, type LoanDesk, startLoanDesk } from './support/loan-desk.js';

/**
 * The loan desk killed with SIGKILL (`DEMO_FAULTS=1`, `Demo-Crash-After`) right after each step of
 * a fine is saved: after a restart the fine is paid once, whether the client retries (the retry
 * resumes at the next step) or never comes back (the completer finishes it).
 */

const FINE = { member: 'U-1007', amount: 1250 };
const STEPS = ['recorded', 'charged', 'paid'];

/** How many times the desk logged `event` (LOG_LEVEL=debug: one line per idempotency event). */
const logged = (desk: LoanDesk, event: string) => desk.output().split(`"msg":"${event}"`).length - 1;
/** A lease short enough for the tests; the completer's own default timing is checked once below. */
const FAST = { IDEMPOTENCY_LEASE: '1s', COMPLETER_INTERVAL: '250ms' };
/**
 * The completer cases count `resumed` events: a lease of 2 s keeps a resuming desk's renewals (every
 * third of it) ahead of the other completer on a loaded machine, so no takeover muddles the count.
 */
const COMPLETING = { ...FAST, IDEMPOTENCY_LEASE: '2s' };

/** Sends the fine that makes the desk kill itself after `point`, and waits for it to have died. */
async function crashAfter(desk: LoanDesk, point: string, key: string): Promise<void> {
  await expect(postFine(desk.baseUrl, FINE, key, { 'demo-crash-after': point })).rejects.toThrow();
  await desk.exited();
}

/** The one paid fine the desk holds, charged once at the provider; its JSON as GET shows it. */
async function expectPaidOnce(desk: LoanDesk, provider: Provider): Promise<any> {
  const fines = await listFines(desk.baseUrl);
  expect(fines).toEqual([{ id: expect.any(Number), ...FINE, status: 'paid', chargeId: expect.any(String) }]);
  const [fine] = fines;
  await expectChargedOnce(provider, fine);
  return fine;
}

// The desk on its two SQL databases (phases); keys in Redis (plain steps) are crashed at every
// step boundary by test/steps.crash.test.ts, and the desk's contract on them is in
// e2e.loan-desk-fines.test.ts: each desk restart here costs seconds of the suite's budget.
const SQL_DATABASES = FINE_DATABASES.filter((database) => !database.name.includes('Redis'));

describeEachDatabase('a fine whose desk died, on $name', SQL_DATABASES, (database) => {
  // Each test its own provider (fine ids start at 1 in each new database) and its own desks.
  let provider: Provider;
  const desks: LoanDesk[] = [];
  const start = async (env: Record<string, string>) => {
    const desk = await startLoanDesk({
      env: { PROVIDER_URL: provider.url, DEMO_FAULTS: '1', LOG_LEVEL: 'debug', ...env },
    });
    desks.push(desk);
    return desk;
  };
  beforeEach(async () => {
    provider = await startPaymentProvider();
  });
  afterEach(async () => {
    for (const desk of desks.splice(0)) await desk.stop();
    await provider?.close();
  });
  afterAll(() => database.cleanup());

  it.each(STEPS)(
    'killed after %s, restarted, the same request resent: 201 paid, the same body on every retry, one fine, one charge',
    async (point) => {
      const env = { ...database.env(), COMPLETER: '0', ADMIN_LOOPBACK: '1', ...FAST };
      const key = `crash-${point}`;
      await crashAfter(await start(env), point, key);
      const desk = await start(env);
      const done = STEPS.slice(0, STEPS.indexOf(point) + 1);
      const record = await (await fetch(`${desk.baseUrl}/admin/keys/anonymous/${key}`)).json();
      expect(record.record).toMatchObject({ state: 'in_progress', steps: done });
      const resent = () => postFine(desk.baseUrl, FINE, key, { 'demo-crash-after': point });
      const first = await resent();
      expect(first.status).toBe(201);
      expect(first.body).toMatchObject({ ...FINE, status: 'paid' });
      const fine = await expectPaidOnce(desk, provider);
      expect(first.body).toEqual(fine);
      for (let retry = 0; retry < 2; retry++) {
        const again = await resent();
        expect(again.status).toBe(201);
        expect(again.headers.get('idempotency-replayed')).toBe('true');
        expect(again.text).toBe(first.text);
      }
      await expectPaidOnce(desk, provider);
      // The finished steps were replayed from the record, not run again; only the rest ran.
      expect(logged(desk, 'step_replayed')).toBe(done.length);
      expect(logged(desk, 'step_saved')).toBe(STEPS.length - done.length);
    },
  );

  it('killed after charged, no retry: the completer pays it (once), and a late retry replays its answer', async () => {
    const env = { ...database.env(), ...COMPLETING };
    await crashAfter(await start(env), 'charged', 'completer-1');
    const desk = await start(env);
    await firstFinePaid(desk.baseUrl, 15_000);
    const fine = await expectPaidOnce(desk, provider);
    const late = await postFine(desk.baseUrl, FINE, 'completer-1');
    expect(late.status).toBe(201);
    expect(late.headers.get('idempotency-replayed')).toBe('true');
    expect(late.body).toEqual(fine);
    expect(logged(desk, 'resumed')).toBe(1);
    expect(logged(desk, 'step_saved')).toBe(1);
  });

  it('two desks running the completer on one database: the fine is finished by one of them, once', async () => {
    const env = { ...database.env(), ...COMPLETING };
    await crashAfter(await start(env), 'charged', 'completer-2');
    const [one, two] = await Promise.all([start(env), start(env)]);
    await firstFinePaid(one!.baseUrl, 15_000);
    await expectPaidOnce(one!, provider);
    // A few more passes of both: nothing more to do for either.
    await new Promise((resolve) => setTimeout(resolve, 1000));
    expect(logged(one!, 'resumed') + logged(two!, 'resumed')).toBe(1);
    expect(logged(one!, 'step_saved') + logged(two!, 'step_saved')).toBe(1);
    await expectPaidOnce(two!, provider);
  });
});

describe('the completer with the desk’s default lease and interval', () => {
  let provider: Provider;
  const desks: LoanDesk[] = [];
  beforeAll(async () => {
    provider = await startPaymentProvider();
  });
  afterAll(async () => {
    for (const desk of desks) await desk.stop();
    await provider?.close();
  });

  it('pays a fine whose desk died after charged within 30 s of the crash, with no retry', async () => {
    const env = { PROVIDER_URL: provider.url, DEMO_FAULTS: '1' };
    const first = await startLoanDesk({ env });
    desks.push(first);
    await crashAfter(first, 'charged', 'completer-defaults');
    const crashedAtMs = Date.now();
    const desk = await startLoanDesk({ env: { ...env, DATABASE_URL: first.databaseUrl } });
    desks.push(desk);
    await firstFinePaid(desk.baseUrl, 30_000 - (Date.now() - crashedAtMs), 250);
    await expectPaidOnce(desk, provider);
  }, 40_000);
});
