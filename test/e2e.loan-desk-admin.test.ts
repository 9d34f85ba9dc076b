import { createHash, randomUUID } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { networkInterfaces } from 'node:os';
import { describe, expect, it } from 'vitest';
import { adminAccess } from '../examples/library-loans/admin.js';
import {
  deskForBlock,
  getJson,
  listLoans,
  postLoan,
  startLoanDesk,
  withLoanDesk,
} from './support/loan-desk.js';
import { dropSchemas, hasPostgres, PG_URL, uniqueName } from './support/services.js';

/**
 * The desk's pages, its admin API over the key store (GET/DELETE /admin/keys…) and who may use it,
 * and the DEMO_FAULTS switch behind the page's lossy network, over real HTTP.
 */

const loan = (issuedAt: string) => ({ member: 'U-1001', isbn: 'K-01', issuedAt });

/** An address of this host that is not loopback, for a caller the admin API must refuse. */
const outsideAddress = Object.values(networkInterfaces())
  .flat()
  .find((address) => address && address.family === 'IPv4' && !address.internal)?.address;

/** GET with the path sent as written (fetch would resolve the `..` first). */
function rawGetStatus(port: number, path: string): Promise<number | undefined> {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path }, (res) => {
        res.resume();
        resolve(res.statusCode);
      })
      .on('error', reject);
  });
}

function fakeRequest(remoteAddress: string, headers: Record<string, string>) {
  return { socket: { remoteAddress }, headers } as never;
}

const LOOPBACK = { adminToken: undefined, adminLoopback: true };
const TOKEN = { adminToken: 's3cret', adminLoopback: false };

describe('adminAccess', () => {
  it('without ADMIN_TOKEN or ADMIN_LOOPBACK admits no one, loopback included', () => {
    expect(
      adminAccess(fakeRequest('127.0.0.1', { host: '127.0.0.1:8483' }), {
        adminToken: undefined,
        adminLoopback: false,
      }).allowed,
    ).toBe(false);
  });

  it('never counts a forwarded request as loopback', () => {
    for (const header of ['x-forwarded-for', 'forwarded', 'via']) {
      const req = fakeRequest('127.0.0.1', { host: '127.0.0.1:8483', [header]: '1.1 nginx' });
      expect(adminAccess(req, LOOPBACK).allowed, header).toBe(false);
    }
  });

  it('with ADMIN_LOOPBACK=1 admits loopback callers that name a loopback host, and no one else', () => {
    for (const [address, host] of [
      ['127.0.0.1', '127.0.0.1:8483'],
      ['::1', '[::1]:8483'],
      ['::ffff:127.0.0.1', 'localhost:8483'],
    ]) {
      expect(adminAccess(fakeRequest(address!, { host: host! }), LOOPBACK).allowed).toBe(true);
    }
    expect(adminAccess(fakeRequest('192.0.2.9', { host: '127.0.0.1:8483' }), LOOPBACK).allowed).toBe(false);
    expect(adminAccess(fakeRequest('::ffff:10.0.0.1', { host: 'localhost' }), LOOPBACK).allowed).toBe(false);
    // A page whose name was rebound to 127.0.0.1 still sends its own name as Host.
    expect(adminAccess(fakeRequest('127.0.0.1', { host: 'evil.example:8483' }), LOOPBACK).allowed).toBe(
      false,
    );
  });

  it('with ADMIN_TOKEN requires the bearer token from every caller, loopback included', () => {
    const local = { host: '127.0.0.1:8483' };
    expect(adminAccess(fakeRequest('127.0.0.1', local), TOKEN).allowed).toBe(false);
    expect(
      adminAccess(fakeRequest('127.0.0.1', { ...local, authorization: 'Bearer wrong' }), TOKEN).allowed,
    ).toBe(false);
    expect(
      adminAccess(fakeRequest('192.0.2.9', { ...local, authorization: 'Bearer s3cret' }), TOKEN).allowed,
    ).toBe(true);
    expect(
      adminAccess(fakeRequest('127.0.0.1', { ...local, authorization: 'bearer s3cret' }), TOKEN).allowed,
    ).toBe(true);
  });
});

describe('loan desk admin API with no settings', () => {
  it('answers 401 on loopback and logs how to open it', async () => {
    await withLoanDesk({}, async (desk) => {
      const response = await fetch(`${desk.baseUrl}/admin/keys`);
      expect(response.status).toBe(401);
      expect(await response.json()).toMatchObject({ error: 'unauthorized', message: /ADMIN_TOKEN/ });
      expect((await fetch(`${desk.baseUrl}/keys`)).status).toBe(200);
      expect(desk.output()).toMatch(/\/keys.*ADMIN_TOKEN.*ADMIN_LOOPBACK=1/);
    });
  });
});

describe('loan desk pages and admin API (ADMIN_LOOPBACK=1, no ADMIN_TOKEN)', () => {
  const desk = deskForBlock({ env: { HOST: '0.0.0.0', ADMIN_LOOPBACK: '1' } });

  const local = () => desk().baseUrl.replace('0.0.0.0', '127.0.0.1');

  it('serves the page, the inspector, their assets, the client module and /members', async () => {
    const page = await fetch(`${local()}/`);
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    expect(await page.text()).toContain('Issue loan');
    expect(await (await fetch(`${local()}/keys`)).text()).toContain('Key store');
    for (const module of ['desk.js', 'keys.js', 'dom.js']) {
      const script = await fetch(`${local()}/pages/${module}`);
      expect(script.headers.get('content-type'), module).toMatch(/^text\/javascript/);
    }
    const client = await fetch(`${local()}/retrysafe/client/index.js`);
    expect(client.status).toBe(200);
    expect(await client.text()).toContain('createRetryingFetch');
    for (const path of [
      '/retrysafe/client/missing.js',
      '/retrysafe/../examples/library-loans/app.js',
      '/pages/../app.js',
    ]) {
      expect(await rawGetStatus(desk().port, path)).toBe(404);
    }
    const members = await getJson(local(), '/members');
    expect(members.status).toBe(200);
    expect(members.body).toContainEqual({ id: 'U-1001', name: 'Ada Okafor' });
    expect(await getJson(local(), '/demo')).toMatchObject({ body: { demoFaults: false } });
  });

  it('lists, shows and deletes keys; a deleted key runs again, finding its loan for the same request', async () => {
    const key = `admin-${randomUUID()}`;
    const first = await postLoan(local(), loan('2026-05-01'), { key });
    expect(first.status).toBe(201);
    const record = { scope: 'anonymous', key };
    const path = `/admin/keys/${encodeURIComponent(record.scope)}/${encodeURIComponent(key)}`;

    const shown = await getJson(local(), path);
    expect(shown.status).toBe(200);
    expect(shown.body.record).toMatchObject({
      ...record,
      state: 'completed',
      status: 201,
      leaseUntilMs: null,
    });
    expect(shown.body.record).not.toHaveProperty('body');
    expect(shown.body.record).not.toHaveProperty('fingerprint');

    const seen: string[] = [];
    let after = '';
    for (let page = 0; page < 100; page++) {
      const listed = await getJson(local(), `/admin/keys?limit=1&after=${encodeURIComponent(after)}`);
      expect(listed.status).toBe(200);
      expect(listed.body.records.length).toBeLessThanOrEqual(1);
      seen.push(...listed.body.records.map((r: { key: string }) => r.key));
      if (listed.body.next === null) break;
      after = listed.body.next;
    }
    expect(seen).toContain(key);

    const before = (await listLoans(local())).length;
    expect((await fetch(`${local()}${path}`, { method: 'DELETE' })).status).toBe(204);
    expect((await getJson(local(), path)).status).toBe(404);
    expect((await fetch(`${local()}${path}`, { method: 'DELETE' })).status).toBe(404);
    // The handler runs again, and the loan keyed by this request's intent is the one it finds.
    const again = await postLoan(local(), loan('2026-05-01'), { key });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotency-replayed')).toBeNull();
    expect(again.body.id).toBe(first.body.id);
    expect((await listLoans(local())).length).toBe(before);
    // Another request under the key, now free, is another loan.
    await fetch(`${local()}${path}`, { method: 'DELETE' });
    const other = await postLoan(local(), loan('2026-05-02'), { key });
    expect(other.status).toBe(201);
    expect(other.body.id).not.toBe(first.body.id);
    expect((await listLoans(local())).length).toBe(before + 1);
  });

  it('answers 401 to a loopback request a proxy forwarded', async () => {
    for (const header of ['x-forwarded-for', 'forwarded', 'via']) {
      const response = await fetch(`${local()}/admin/keys`, { headers: { [header]: '127.0.0.1' } });
      expect(response.status, header).toBe(401);
      expect(await response.json()).toMatchObject({ error: 'unauthorized' });
    }
    expect((await fetch(`${local()}/admin/keys`)).status).toBe(200);
  });

  it('answers 400 to a bad limit or cursor', async () => {
    expect(await getJson(local(), '/admin/keys?limit=0')).toMatchObject({
      status: 400,
      body: { error: 'invalid_query' },
    });
    expect((await getJson(local(), '/admin/keys?after=nonsense')).status).toBe(400);
  });

  it.skipIf(!outsideAddress)('refuses a caller that is not on loopback with 401', async () => {
    const port = new URL(desk().baseUrl).port;
    const response = await fetch(`http://${outsideAddress}:${port}/admin/keys`);
    expect(response.status).toBe(401);
    expect(response.headers.get('www-authenticate')).toMatch(/^Bearer/);
    expect(await response.json()).toMatchObject({ error: 'unauthorized' });
    // The rest of the desk is open to it.
    expect((await fetch(`http://${outsideAddress}:${port}/books`)).status).toBe(200);
  });

  it('ignores the lossy-network mark unless the desk runs with DEMO_FAULTS=1', async () => {
    const answered = await postLoan(local(), loan('2026-05-02'), {
      key: `mark-${randomUUID()}`,
      headers: { 'x-demo-lose-response': '1' },
    });
    expect(answered.status).toBe(201);
  });
});

describe('loan desk admin API with ADMIN_TOKEN and DEMO_FAULTS=1', () => {
  const desk = deskForBlock({ env: { ADMIN_TOKEN: 'token-for-test', DEMO_FAULTS: '1' } });

  it('answers 401 without the token, even on loopback, and 200 with it', async () => {
    const without = await fetch(`${desk().baseUrl}/admin/keys`);
    expect(without.status).toBe(401);
    const wrong = await fetch(`${desk().baseUrl}/admin/keys`, { headers: { authorization: 'Bearer nope' } });
    expect(wrong.status).toBe(401);
    const right = await fetch(`${desk().baseUrl}/admin/keys`, {
      headers: { authorization: 'Bearer token-for-test' },
    });
    expect(right.status).toBe(200);
    expect(await right.json()).toMatchObject({ records: expect.any(Array) });
  });

  it('/metrics wants the token too', async () => {
    expect((await fetch(`${desk().baseUrl}/metrics`)).status).toBe(401);
    const right = await fetch(`${desk().baseUrl}/metrics`, {
      headers: { authorization: 'Bearer token-for-test' },
    });
    expect(right.status).toBe(200);
    expect(await right.text()).toContain('retrysafe_outcomes_total');
  });

  it('shows a keyed digest as the scope, not the sha256 of the Authorization', async () => {
    const key = `scope-${randomUUID()}`;
    const token = `weak-${randomUUID()}`;
    expect((await postLoan(desk().baseUrl, loan('2026-05-04'), { key, token })).status).toBe(201);
    const listed = await fetch(`${desk().baseUrl}/admin/keys?limit=1000`, {
      headers: { authorization: 'Bearer token-for-test' },
    });
    const { records } = await listed.json();
    const { scope } = records.find((r: { key: string }) => r.key === key);
    const unkeyed = createHash('sha256').update(`Bearer ${token}`).digest('base64url');
    expect(scope).toMatch(/^hmac-sha256:/);
    expect(scope).not.toContain(unkeyed);
  });

  it('a marked loan is lent and its answer lost; the retry with the same key replays that loan', async () => {
    const key = `lossy-${randomUUID()}`;
    const before = (await listLoans(desk().baseUrl)).length;
    await expect(
      postLoan(desk().baseUrl, loan('2026-05-03'), { key, headers: { 'x-demo-lose-response': '1' } }),
    ).rejects.toThrow(TypeError);
    expect((await listLoans(desk().baseUrl)).length).toBe(before + 1);
    const retry = await postLoan(desk().baseUrl, loan('2026-05-03'), { key });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotency-replayed')).toBe('true');
    expect((await listLoans(desk().baseUrl)).length).toBe(before + 1);
    expect(await getJson(desk().baseUrl, '/demo')).toMatchObject({ body: { demoFaults: true } });
  });
});

describe('loan desk with DEMO_FAULTS=1: the lossy switch is a fault proxy in front of the desk', () => {
  it('with WORKERS=2 too: a marked loan is lent, its answer lost, and the retry replays it', async () => {
    const desk = await startLoanDesk({ workers: 2, env: { DEMO_FAULTS: '1' } });
    try {
      const key = `lossy-workers-${randomUUID()}`;
      const before = (await listLoans(desk.baseUrl)).length;
      await expect(
        postLoan(desk.baseUrl, loan('2026-05-06'), { key, headers: { 'x-demo-lose-response': '1' } }),
      ).rejects.toThrow(TypeError);
      const retry = await postLoan(desk.baseUrl, loan('2026-05-06'), { key });
      expect(retry.status).toBe(201);
      expect(retry.headers.get('idempotency-replayed')).toBe('true');
      expect((await listLoans(desk.baseUrl)).length).toBe(before + 1);
      // The workers serve behind the proxy, on a port of their own.
      const serving = /^worker \d+ serving (\S+)/m.exec(desk.output())![1];
      expect(serving).not.toBe(desk.baseUrl);
    } finally {
      expect(await desk.stop()).toBe(0);
    }
  }, 40_000);

  it('with WORKERS=2, a port taken stops the start, saying so', async () => {
    const taken = net.createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const { port } = taken.address() as net.AddressInfo;
    try {
      await expect(
        startLoanDesk({ workers: 2, env: { DEMO_FAULTS: '1', PORT: String(port) } }),
      ).rejects.toThrow(/loan desk: the fault proxy cannot listen: listen EADDRINUSE/);
    } finally {
      taken.close();
    }
  }, 30_000);

  it('refuses to start on a host that is not loopback', async () => {
    await expect(startLoanDesk({ env: { DEMO_FAULTS: '1', HOST: '0.0.0.0' } })).rejects.toThrow(
      /HOST="0\.0\.0\.0" is invalid: expected a loopback address .* with DEMO_FAULTS=1/,
    );
  });
});

describe.skipIf(!hasPostgres)('two desks on one PostgreSQL database', () => {
  it('agree on the scope secret: a key sent to one replays on the other', async () => {
    const schema = uniqueName('desk_secret');
    const env = { DATABASE_URL: `${PG_URL}?schema=${schema}` };
    const first = await startLoanDesk({ env });
    const second = await startLoanDesk({ env });
    try {
      const key = `shared-${randomUUID()}`;
      const sent = await postLoan(first.baseUrl, loan('2026-05-05'), { key, token: 'member-token' });
      expect(sent.status).toBe(201);
      const again = await postLoan(second.baseUrl, loan('2026-05-05'), { key, token: 'member-token' });
      expect(again.status).toBe(201);
      expect(again.headers.get('idempotency-replayed')).toBe('true');
      expect(again.body).toEqual(sent.body);
    } finally {
      await Promise.all([first.stop(), second.stop()]);
      await dropSchemas(schema);
    }
  }, 60_000);
});

describe('loan desk admin API: a stored answer, decrypted, behind ADMIN_TOKEN', () => {
  const encryptionKey = Buffer.alloc(32, 7).toString('base64');
  const desk = deskForBlock({
    env: { ADMIN_TOKEN: 'token-for-test', IDEMPOTENCY_ENCRYPTION_KEY: encryptionKey },
  });

  it('GET /admin/keys/:scope/:key?response=1 shows the saved status, headers and body; without the token, nothing', async () => {
    const key = `answer-${randomUUID()}`;
    const lent = await postLoan(desk().baseUrl, loan('2026-05-05'), { key });
    expect(lent.status).toBe(201);
    const path = `/admin/keys/anonymous/${encodeURIComponent(key)}?response=1`;
    const without = await fetch(`${desk().baseUrl}${path}`);
    expect(without.status).toBe(401);
    expect(await without.text()).not.toContain('2026-05-05');
    const shown = await fetch(`${desk().baseUrl}${path}`, {
      headers: { authorization: 'Bearer token-for-test' },
    });
    expect(shown.status).toBe(200);
    const { record } = await shown.json();
    expect(record.response).toMatchObject({
      status: 201,
      headers: { location: expect.stringMatching(/^\/loans\//) },
    });
    expect(JSON.parse(record.response.body)).toEqual(lent.body);
    // Without ?response=1 the record is its summary only.
    const summary = await fetch(`${desk().baseUrl}${path.replace('?response=1', '')}`, {
      headers: { authorization: 'Bearer token-for-test' },
    });
    expect((await summary.json()).record).not.toHaveProperty('response');
  });
});
