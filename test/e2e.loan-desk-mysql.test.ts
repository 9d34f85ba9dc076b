import { randomUUID } from 'node:crypto';
import mysql from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { getJson, type LoanDesk, listLoans, postLoan, startLoanDesk } from './support/loan-desk.js';
import { hasMysql, MYSQL_URL, uniqueName } from './support/services.js';

/**
 * The loan desk on MariaDB (`DATABASE_URL=mysql://…`): loans and keys in one database, atomic
 * mode by default, two workers. The database does not exist before the desk starts: it makes it.
 */
describe.skipIf(!hasMysql)('loan desk on MariaDB, WORKERS=2', () => {
  const name = uniqueName('retrysafe');
  const url = new URL(MYSQL_URL);
  url.pathname = `/${name}`;
  let desk: LoanDesk;

  beforeAll(async () => {
    desk = await startLoanDesk({ workers: 2, env: { DATABASE_URL: url.toString() } });
    await vi.waitFor(() => expect(desk.output().match(/^worker \d+ serving/gm)).toHaveLength(2), {
      timeout: 20_000,
      interval: 50,
    });
  });

  afterAll(async () => {
    expect(await desk?.stop()).toBe(0);
    const admin = await mysql.createConnection({ uri: MYSQL_URL });
    await admin.query(`DROP DATABASE IF EXISTS \`${name}\``);
    await admin.end();
  });

  it('says where it runs: MySQL, keys in the database, atomic mode', () => {
    expect(desk.output()).toMatch(
      /MySQL 127\.0\.0\.1:3306\/retrysafe_\w+; keys in the database, atomic mode/,
    );
  });

  it('serves the catalog, keyless loans and validation errors', async () => {
    const books = await getJson(desk.baseUrl, '/books');
    expect(books.body).toHaveLength(10);
    const loan = { member: 'U-1001', isbn: 'K-01', issuedAt: '2026-02-01' };
    const made = await postLoan(desk.baseUrl, loan);
    expect(made.status).toBe(201);
    expect(made.body).toEqual({ id: expect.any(Number), ...loan });
    expect((await getJson(desk.baseUrl, `/loans/${made.body.id}`)).body).toEqual({
      ...made.body,
      return: null,
    });
    const unknown = await postLoan(desk.baseUrl, { ...loan, isbn: 'K-99' });
    expect(unknown.status).toBe(422);
    expect(unknown.body).toMatchObject({ error: 'validation', field: 'isbn' });
  });

  it('200 concurrent requests over 20 keys, across both workers: one loan per key', async () => {
    const before = (await listLoans(desk.baseUrl)).length;
    const keys = Array.from({ length: 20 }, (_, i) => ({
      key: `MY-${randomUUID()}`,
      body: {
        member: `U-${1001 + (i % 10)}`,
        isbn: `K-${String(1 + (i % 10)).padStart(2, '0')}`,
        issuedAt: `2026-03-${String(i + 1).padStart(2, '0')}`,
      },
    }));
    const responses = await Promise.all(
      Array.from({ length: 200 }, (_, i) => {
        const { key, body } = keys[i % 20]!;
        return postLoan(desk.baseUrl, body, { key }).then((response) => ({ key, response }));
      }),
    ).catch((error) => {
      throw new Error(`${(error as Error).message}; the desk said:\n${desk.output().slice(-3000)}`, {
        cause: error,
      });
    });
    expect(responses.map(({ response }) => response.status)).toEqual(Array(200).fill(201));
    expect(desk.output()).not.toMatch(/worker \d+ died/);
    for (const { key } of keys) {
      const mine = responses.filter((r) => r.key === key).map((r) => r.response);
      expect(new Set(mine.map((r) => r.text)).size).toBe(1);
      expect(mine.filter((r) => r.headers.get('idempotency-replayed') === null)).toHaveLength(1);
    }
    const loans = await listLoans(desk.baseUrl);
    expect(loans.length).toBe(before + 20);
    expect(new Set(responses.map(({ response }) => response.body.id)).size).toBe(20);
  });

  it("each loan's receipt job commits with it and is sent: GET /loans/:id/receipt answers 200", async () => {
    const loan = { member: 'U-1004', isbn: 'K-05', issuedAt: '2026-04-03' };
    const keyed = await postLoan(desk.baseUrl, loan, { key: `MY-${randomUUID()}` });
    const keyless = await postLoan(desk.baseUrl, loan);
    for (const { body } of [keyed, keyless]) {
      await vi.waitFor(
        async () => expect((await getJson(desk.baseUrl, `/loans/${body.id}/receipt`)).status).toBe(200),
        { timeout: 20_000, interval: 50 },
      );
      expect((await getJson(desk.baseUrl, `/loans/${body.id}/receipt`)).body).toMatchObject({
        loanId: body.id,
        ...loan,
        delivery: 1,
      });
    }
  });

  it('a key reused with another body is 409 key_conflict and makes no loan', async () => {
    const key = `MY-${randomUUID()}`;
    const loan = { member: 'U-1002', isbn: 'K-02', issuedAt: '2026-04-01' };
    expect((await postLoan(desk.baseUrl, loan, { key })).status).toBe(201);
    const before = (await listLoans(desk.baseUrl)).length;
    const other = await postLoan(desk.baseUrl, { ...loan, issuedAt: '2026-04-02' }, { key });
    expect(other.status).toBe(409);
    expect(other.body).toMatchObject({ error: 'key_conflict', key });
    expect((await listLoans(desk.baseUrl)).length).toBe(before);
  });
});
