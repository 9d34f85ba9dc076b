import { randomUUID } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { NODE_SQLITE_MIN_VERSION, nodeSqliteAvailable } from '../src/stores/sqlite/driver.js';
import {
  describeEachDatabase,
  getJson,
  type LoanDesk,
  listLoans,
  postLoan,
  startLoanDesk,
} from './support/loan-desk.js';
import { dropSchemas, hasPostgres, PG_URL, uniqueName } from './support/services.js';

const WITHOUT_BETTER_SQLITE3 = fileURLToPath(
  new URL('./support/without-better-sqlite3.mjs', import.meta.url),
);

/**
 * Every row of the HTTP outcomes (docs/reference.md) and the loan desk’s API (examples/library-loans/README.md) over real HTTP against the loan desk as a child process, on
 * SQLite in atomic and lease mode and on PostgreSQL in atomic mode.
 */

const DAY_MS = 86_400_000;
let intents = 0;
/** A loan intent no other test sends (its issuedAt is unique within this file). */
function intent(overrides: Record<string, unknown> = {}) {
  intents++;
  return {
    member: `U-${1001 + (intents % 10)}`,
    isbn: `K-${String(1 + (intents % 10)).padStart(2, '0')}`,
    issuedAt: new Date(Date.UTC(2026, 0, 1) + intents * DAY_MS).toISOString().slice(0, 10),
    ...overrides,
  };
}
const key = (label = 'K') => `${label}-${randomUUID()}`;

/** Sends a request with exactly the header lines given, for what fetch refuses to send. */
function rawPost(
  port: number,
  headerLines: string[],
  body: string,
): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    let received = '';
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => (received += chunk));
    socket.on('error', reject);
    socket.on('end', () => {
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(received)?.[1]);
      resolve({ status, text: received.slice(received.indexOf('\r\n\r\n') + 4) });
    });
    socket.write(
      [
        'POST /loans HTTP/1.1',
        'Host: 127.0.0.1',
        'Content-Type: application/json',
        `Content-Length: ${Buffer.byteLength(body)}`,
        'Connection: close',
        ...headerLines,
        '',
        body,
      ].join('\r\n'),
      'latin1',
    );
  });
}

/** A POST carrying the same header twice (node:http sends an array value as two lines). */
function postWithTwoKeys(
  port: number,
  keys: [string, string],
  body: string,
): Promise<{ status: number; body: any }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/loans' }, (res) => {
      let text = '';
      res.setEncoding('utf8').on('data', (chunk: string) => (text += chunk));
      res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(text) }));
    });
    req.on('error', reject);
    req.setHeader('content-type', 'application/json');
    req.setHeader('idempotency-key', keys);
    req.end(body);
  });
}

interface Setup {
  name: string;
  skip: boolean;
  env: () => Record<string, string>;
  cleanup?: () => Promise<void>;
}

const pgSchema = uniqueName('rs_loan_desk');
const setups: Setup[] = [
  { name: 'SQLite, atomic mode (default)', skip: false, env: () => ({}) },
  { name: 'SQLite, lease mode', skip: false, env: () => ({ IDEMPOTENCY_MODE: 'lease' }) },
  {
    // The desk's fallback where no native addon is installed: the store and the desk's own
    // connections on node:sqlite, in atomic mode.
    name: `SQLite on node:sqlite without better-sqlite3 installed, atomic mode (Node ≥ ${NODE_SQLITE_MIN_VERSION})`,
    skip: !nodeSqliteAvailable(),
    env: () => ({ NODE_OPTIONS: `--import ${WITHOUT_BETTER_SQLITE3}` }),
  },
  {
    name: 'PostgreSQL, atomic mode',
    skip: !hasPostgres,
    env: () => ({ DATABASE_URL: `${PG_URL}?schema=${pgSchema}` }),
    cleanup: () => dropSchemas(pgSchema),
  },
];

describeEachDatabase('loan desk on $name', setups, (setup) => {
  let desk: LoanDesk;
  let base: string;
  const count = async () => (await listLoans(base)).length;

  beforeAll(async () => {
    desk = await startLoanDesk({ env: setup.env() });
    base = desk.baseUrl;
  });
  afterAll(async () => {
    expect(await desk?.stop()).toBe(0);
    await setup.cleanup?.();
  });

  it('creates the schema and the catalog on first start', async () => {
    const books = await getJson(base, '/books');
    expect(books.status).toBe(200);
    expect(books.body.map((b: { isbn: string }) => b.isbn)).toEqual(
      Array.from({ length: 10 }, (_, i) => `K-${String(i + 1).padStart(2, '0')}`),
    );
  });

  it('without a key every POST is a new loan (201, Location, the loan)', async () => {
    const before = await count();
    const body = intent();
    const first = await postLoan(base, body);
    const second = await postLoan(base, body);
    for (const response of [first, second]) {
      expect(response.status).toBe(201);
      expect(response.body).toEqual({ id: expect.any(Number), ...body });
      expect(response.headers.get('location')).toBe(`/loans/${response.body.id}`);
      expect(response.headers.get('idempotency-replayed')).toBeNull();
    }
    expect(second.body.id).not.toBe(first.body.id);
    expect(await count()).toBe(before + 2);
    const stored = await getJson(base, `/loans/${first.body.id}`);
    expect(stored.body).toEqual({ ...first.body, return: null });
  });

  it('replays a completed key: one loan, same status, headers and body, Idempotency-Replayed: true', async () => {
    const before = await count();
    const k = key('OD');
    const body = intent();
    const first = await postLoan(base, body, { key: k });
    const again = await postLoan(base, body, { key: k });
    expect(first.status).toBe(201);
    expect(first.headers.get('idempotency-replayed')).toBeNull();
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotency-replayed')).toBe('true');
    expect(again.text).toBe(first.text);
    expect(again.headers.get('location')).toBe(first.headers.get('location'));
    expect(again.headers.get('content-type')).toBe(first.headers.get('content-type'));
    expect(await count()).toBe(before + 1);
  });

  it('a key reused with another body or path is 409 key_conflict and runs nothing', async () => {
    const k = key('OD');
    const body = intent();
    expect((await postLoan(base, body, { key: k })).status).toBe(201);
    const before = await count();
    const otherBody = await postLoan(base, intent(), { key: k });
    expect(otherBody.status).toBe(409);
    expect(otherBody.body).toMatchObject({ error: 'key_conflict', key: k });
    const otherPath = await fetch(`${base}/loans?copy=2`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': k },
      body: JSON.stringify(body),
    });
    expect(otherPath.status).toBe(409);
    expect(await count()).toBe(before);
    // The original still replays.
    expect((await postLoan(base, body, { key: k })).headers.get('idempotency-replayed')).toBe('true');
  });

  it('50 concurrent requests with one key make one loan and all get the same body', async () => {
    const before = await count();
    const k = key('OD');
    const body = intent();
    const responses = await Promise.all(Array.from({ length: 50 }, () => postLoan(base, body, { key: k })));
    expect(responses.map((r) => r.status)).toEqual(Array(50).fill(201));
    expect(new Set(responses.map((r) => r.text)).size).toBe(1);
    expect(responses.filter((r) => r.headers.get('idempotency-replayed') === null)).toHaveLength(1);
    expect(await count()).toBe(before + 1);
  });

  it('malformed keys are 400 before any side effect', async () => {
    const before = await count();
    const body = JSON.stringify(intent());
    for (const bad of ['', 'x'.repeat(256), '"unterminated', 'a b']) {
      const response = await postLoan(base, body, { key: bad });
      expect(response.status, JSON.stringify(bad)).toBe(400);
      expect(response.body.error).toBe('idempotency_key_invalid');
    }
    const control = await rawPost(desk.port, ['Idempotency-Key: OD-\x01x'], body);
    expect(control.status).toBe(400);
    const two = await postWithTwoKeys(desk.port, [key(), key()], body);
    expect(two.status).toBe(400);
    expect(two.body.error).toBe('idempotency_key_invalid');
    expect(await count()).toBe(before);
    // The longest key allowed works; a quoted sf-string names the same key as the bare token.
    const longest = 'k'.repeat(255);
    expect((await postLoan(base, body, { key: longest })).status).toBe(201);
    const quoted = await postLoan(base, body, { key: `"${longest}"` });
    expect(quoted.headers.get('idempotency-replayed')).toBe('true');
    expect(await count()).toBe(before + 1);
  });

  it('keys are scoped by the bearer token; anonymous callers share one scope', async () => {
    const before = await count();
    const k = key('OD');
    const body = intent();
    const alice = await postLoan(base, body, { key: k, token: 'alice-token' });
    const bob = await postLoan(base, body, { key: k, token: 'bob-token' });
    expect(alice.status).toBe(201);
    expect(bob.status).toBe(201);
    expect(bob.body.id).not.toBe(alice.body.id);
    expect(bob.headers.get('idempotency-replayed')).toBeNull();
    const aliceAgain = await postLoan(base, body, { key: k, token: 'alice-token' });
    expect(aliceAgain.headers.get('idempotency-replayed')).toBe('true');
    expect(aliceAgain.body.id).toBe(alice.body.id);
    const anonymous = await postLoan(base, body, { key: k });
    const anonymousAgain = await postLoan(base, body, { key: k });
    expect(anonymous.body.id).not.toBe(alice.body.id);
    expect(anonymousAgain.headers.get('idempotency-replayed')).toBe('true');
    expect(await count()).toBe(before + 3);
  });

  it('any Authorization value names its own scope (Basic, malformed Bearer); only no credential is anonymous', async () => {
    const before = await count();
    const k = key('OD');
    const body = intent();
    const basic = (user: string) => `Basic ${Buffer.from(`${user}:pw`).toString('base64')}`;
    const callers = [basic('alice'), basic('bob'), 'Bearer A B', 'Bearer A'];
    const first = [];
    for (const authorization of callers) {
      first.push(await postLoan(base, body, { key: k, headers: { authorization } }));
    }
    expect(first.map((r) => r.status)).toEqual([201, 201, 201, 201]);
    expect(first.map((r) => r.headers.get('idempotency-replayed'))).toEqual([null, null, null, null]);
    expect(new Set(first.map((r) => r.body.id)).size).toBe(callers.length);
    const anonymous = await postLoan(base, body, { key: k });
    expect(anonymous.headers.get('idempotency-replayed')).toBeNull();
    for (const [i, authorization] of callers.entries()) {
      const again = await postLoan(base, body, { key: k, headers: { authorization } });
      expect(again.headers.get('idempotency-replayed')).toBe('true');
      expect(again.body.id).toBe(first[i]!.body.id);
    }
    expect(await count()).toBe(before + callers.length + 1);
  });

  it('a control character (NUL) in member or isbn is 400 validation, keyed or not, and lends nothing', async () => {
    const before = await count();
    for (const field of ['member', 'isbn']) {
      const body = intent({ [field]: `${field === 'member' ? 'U-1001' : 'K-01'}\u0000` });
      for (const k of [undefined, key()]) {
        const response = await postLoan(base, body, { key: k });
        expect(response.status, `${field}, key ${k ?? 'none'}`).toBe(400);
        expect(response.body).toMatchObject({ error: 'validation', field });
      }
    }
    expect(await count()).toBe(before);
  });

  it('unknown isbn or member is 422 validation with the field, not stored under the key, nothing lent', async () => {
    const before = await count();
    const noBook = await postLoan(base, intent({ isbn: 'K-99' }));
    expect(noBook.status).toBe(422);
    expect(noBook.body).toMatchObject({ error: 'validation', field: 'isbn' });
    const noMember = await postLoan(base, intent({ member: 'U-0000' }));
    expect(noMember.status).toBe(422);
    expect(noMember.body).toMatchObject({ error: 'validation', field: 'member' });
    const k = key();
    const body = intent({ isbn: 'K-404' });
    const keyed = await postLoan(base, body, { key: k });
    const again = await postLoan(base, body, { key: k });
    expect(keyed.status).toBe(422);
    expect(again.status).toBe(422);
    expect(again.headers.get('idempotency-replayed')).toBeNull();
    expect(await count()).toBe(before);
    // The refusal did not burn the key: the corrected intent under it lends once, then replays.
    const corrected = intent();
    const lent = await postLoan(base, corrected, { key: k });
    expect(lent.status).toBe(201);
    const replay = await postLoan(base, corrected, { key: k });
    expect(replay.headers.get('idempotency-replayed')).toBe('true');
    expect(replay.body.id).toBe(lent.body.id);
    expect(await count()).toBe(before + 1);
  });

  it('invalid JSON is 400 and frees the key for the corrected body', async () => {
    const before = await count();
    const k = key();
    expect((await postLoan(base, '{"member":', { key: k })).status).toBe(400);
    const corrected = await postLoan(base, intent(), { key: k });
    expect(corrected.status).toBe(201);
    expect(corrected.headers.get('idempotency-replayed')).toBeNull();
    expect(await count()).toBe(before + 1);
  });

  it('bad input is a 4xx JSON error, creates nothing, and the desk stays up', async () => {
    const before = await count();
    const cases: Array<[string, string, number, Record<string, unknown>]> = [
      ['invalid JSON', '{"member":', 400, { error: 'invalid_json' }],
      ['empty body', '', 400, { error: 'invalid_body' }],
      ['array body', '[{"member":"U-1001"}]', 400, { error: 'invalid_body' }],
      ['null body', 'null', 400, { error: 'invalid_body' }],
      ['number body', '42', 400, { error: 'invalid_body' }],
      [
        'member a number',
        JSON.stringify(intent({ member: 1001 })),
        400,
        { error: 'validation', field: 'member' },
      ],
      [
        'isbn missing',
        JSON.stringify(intent({ isbn: undefined })),
        400,
        { error: 'validation', field: 'isbn' },
      ],
      [
        'isbn an array',
        JSON.stringify(intent({ isbn: ['K-01'] })),
        400,
        { error: 'validation', field: 'isbn' },
      ],
      [
        'issuedAt not a date',
        JSON.stringify(intent({ issuedAt: 'soon' })),
        400,
        { error: 'validation', field: 'issuedAt' },
      ],
      [
        'issuedAt a number',
        JSON.stringify(intent({ issuedAt: 20260310 })),
        400,
        { error: 'validation', field: 'issuedAt' },
      ],
      [
        'issuedAt not on the calendar',
        JSON.stringify(intent({ issuedAt: '2026-02-31' })),
        400,
        { error: 'validation', field: 'issuedAt' },
      ],
    ];
    for (const [label, body, status, error] of cases) {
      for (const k of [undefined, key()]) {
        const response = await postLoan(base, body, { key: k });
        expect(response.status, `${label}, key ${k ?? 'none'}`).toBe(status);
        expect(response.headers.get('content-type')).toMatch(/^application\/json/);
        expect(response.body, label).toMatchObject(error);
      }
    }
    for (const k of [undefined, key()]) {
      const huge = await postLoan(base, JSON.stringify({ ...intent(), pad: 'x'.repeat(2 * 1024 * 1024) }), {
        key: k,
      });
      expect(huge.status).toBe(413);
      expect(huge.body.error).toBe('body_too_large');
    }
    expect(await count()).toBe(before);
    expect((await postLoan(base, intent())).status).toBe(201);
  });

  it('a body that is not application/json is 415 (a cross-site form cannot lend), nothing stored, key free', async () => {
    const before = await count();
    const k = key('CT');
    const body = JSON.stringify(intent());
    for (const type of [
      'text/plain',
      'application/x-www-form-urlencoded',
      'application/json; charset=latin1',
    ]) {
      const refused = await postLoan(base, body, { key: k, headers: { 'content-type': type } });
      expect(refused.status, type).toBe(415);
      expect(refused.body, type).toMatchObject({ error: 'unsupported_media_type' });
    }
    const untyped = await fetch(`${base}/loans`, {
      method: 'POST',
      headers: { 'idempotency-key': k },
      body: new Blob([body]),
    });
    expect(untyped.status).toBe(415);
    expect(await count()).toBe(before);
    const accepted = await postLoan(base, body, {
      key: k,
      headers: { 'content-type': 'Application/JSON; Charset=UTF-8' },
    });
    expect(accepted.status).toBe(201);
    expect(accepted.headers.get('idempotency-replayed')).toBeNull();
    expect(await count()).toBe(before + 1);
  });

  it('30 fetch uploads of 5 MB all get their 413 with Connection: close (none a reset, so no client retries them)', async () => {
    const body = JSON.stringify({ ...intent(), pad: 'x'.repeat(5_000_000) });
    const outcomes: string[] = [];
    for (let i = 0; i < 30; i++) {
      outcomes.push(
        await postLoan(base, body, { key: key('BIG') }).then(
          (response) => `${response.status} ${response.headers.get('connection')}`,
          (error: { cause?: { code?: string } }) => error.cause?.code ?? String(error),
        ),
      );
    }
    expect(outcomes).toEqual(Array(30).fill('413 close'));
    expect((await postLoan(base, intent(), { key: key() })).status).toBe(201);
  });

  it('answers unknown paths 404, unknown loans 404, wrong methods 405; GET ignores keys', async () => {
    expect((await getJson(base, '/nowhere')).body).toEqual({ error: 'path_not_found' });
    expect((await getJson(base, '/nowhere')).status).toBe(404);
    for (const path of ['/loans/999999', '/loans/abc', '/loans/99999999999999999999']) {
      const missing = await getJson(base, path);
      expect(missing.status, path).toBe(404);
      expect(missing.body).toEqual({ error: 'loan_not_found' });
    }
    const del = await fetch(`${base}/loans`, { method: 'DELETE' });
    expect(del.status).toBe(405);
    expect(del.headers.get('allow')).toBe('GET, HEAD, POST');
    const put = await fetch(`${base}/books`, { method: 'PUT', body: '{}' });
    expect(put.status).toBe(405);
    const k = key();
    const listed = await fetch(`${base}/loans`, { headers: { 'idempotency-key': k } });
    const listedAgain = await fetch(`${base}/loans`, { headers: { 'idempotency-key': k } });
    expect(listed.status).toBe(200);
    expect(listedAgain.headers.get('idempotency-replayed')).toBeNull();
    expect(Array.isArray(await listedAgain.json())).toBe(true);
  });
});
