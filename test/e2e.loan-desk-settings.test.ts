import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { postLoan, ROOT, startLoanDesk, tempDatabaseUrl } from './support/loan-desk.js';
import { sqliteRows } from './support/sqlite-rows.js';

/** Loan desk settings that change what is kept: the encryption key ring, and the purge command. */

const run = promisify(execFile);
const aesKey = (n: number) => Buffer.alloc(32, n).toString('base64');
const key = () => `OD-${randomUUID()}`;
let intents = 0;
const intent = () => {
  intents++;
  return { member: 'U-1001', isbn: 'K-01', issuedAt: `2027-01-${String(intents).padStart(2, '0')}` };
};

describe('loan desk IDEMPOTENCY_ENCRYPTION_KEY', () => {
  it('encrypts stored answers; after a rotation ("new,old") the old answers still replay', async () => {
    const databaseUrl = tempDatabaseUrl('encrypted');
    const [oldKey, newKey] = [aesKey(1), aesKey(2)];
    const before = { key: key(), body: intent() };
    const after = { key: key(), body: intent() };

    const first = await startLoanDesk({
      env: { DATABASE_URL: databaseUrl, IDEMPOTENCY_ENCRYPTION_KEY: oldKey },
    });
    let original: Awaited<ReturnType<typeof postLoan>>;
    try {
      original = await postLoan(first.baseUrl, before.body, { key: before.key });
      expect(original.status).toBe(201);
    } finally {
      expect(await first.stop()).toBe(0);
    }
    const bodies = sqliteRows<{ body: Buffer }>(databaseUrl, 'SELECT body FROM idempotency_keys').map(
      (row) => row.body,
    );
    expect(bodies).toHaveLength(1);
    expect(bodies[0]!.toString('latin1')).not.toContain(before.body.issuedAt);

    const rotated = await startLoanDesk({
      env: { DATABASE_URL: databaseUrl, IDEMPOTENCY_ENCRYPTION_KEY: `${newKey},${oldKey}` },
    });
    try {
      const replay = await postLoan(rotated.baseUrl, before.body, { key: before.key });
      expect(replay.status).toBe(201);
      expect(replay.headers.get('idempotency-replayed')).toBe('true');
      expect(replay.text).toBe(original.text);
      expect((await postLoan(rotated.baseUrl, after.body, { key: after.key })).status).toBe(201);
    } finally {
      expect(await rotated.stop()).toBe(0);
    }

    // The new key alone reads what was written after the rotation, not what only the old key sealed.
    const retired = await startLoanDesk({
      env: { DATABASE_URL: databaseUrl, IDEMPOTENCY_ENCRYPTION_KEY: newKey },
    });
    try {
      const recent = await postLoan(retired.baseUrl, after.body, { key: after.key });
      expect(recent.headers.get('idempotency-replayed')).toBe('true');
      const unreadable = await postLoan(retired.baseUrl, before.body, { key: before.key });
      expect(unreadable.status).toBe(500);
      expect(unreadable.body.error).toBe('replay_unreadable');
    } finally {
      expect(await retired.stop()).toBe(0);
    }
  });

  it.each(['c2hvcnQ=', `${aesKey(1)},`, `${aesKey(1)},not base64!`])(
    'refuses to start with %j, naming the variable',
    async (value) => {
      await expect(startLoanDesk({ env: { IDEMPOTENCY_ENCRYPTION_KEY: value } })).rejects.toThrow(
        /IDEMPOTENCY_ENCRYPTION_KEY=/,
      );
    },
  );
});

describe('loan desk DATABASE_URL mistakes', () => {
  it.each([
    ['postgres://[bad', /DATABASE_URL="postgres:\/\/\[bad" is invalid: .*host/],
    ['postgres://root@127.0.0.1:99999/test', /DATABASE_URL=.* is invalid: .*port 99999/],
    ['postgress://root@127.0.0.1:5432/test', /DATABASE_URL=.* is invalid: .*postgress:/],
    [
      'mysql://root@127.0.0.1:3306',
      /DATABASE_URL=.* is invalid: expected a mysql:\/\/ URL naming its database/,
    ],
    ['mysql://root@127.0.0.1:99999/library', /DATABASE_URL=.* is invalid: .*port 99999/],
    [
      'postgres://root@127.0.0.1:6432/test?pooling=statement',
      /DATABASE_URL=.* is invalid: .*pooling=transaction/,
    ],
  ])('%s stops the start naming the variable and the mistake, exit 1, no stack', async (url, message) => {
    const start = run(process.execPath, ['examples/library-loans/server.js'], {
      cwd: ROOT,
      env: { ...process.env, PORT: '0', DATABASE_URL: url },
    });
    const failed = await start.then(
      () => ({ code: 0, stderr: '' }),
      (error: { code: number; stderr: string }) => error,
    );
    expect(failed.code).toBe(1);
    expect(failed.stderr).toMatch(message);
    expect(failed.stderr).not.toMatch(/^\s+at /m);
  });
});

describe('npm run purge', () => {
  it('fails on a SQLite path that does not exist, and creates nothing there', async () => {
    const missing = tempDatabaseUrl('mistyped');
    const purge = run(process.execPath, ['examples/library-loans/purge.js'], {
      cwd: ROOT,
      env: { ...process.env, DATABASE_URL: missing },
    });
    await expect(purge).rejects.toMatchObject({ code: 1, stderr: expect.stringContaining(missing) });
    expect(existsSync(missing)).toBe(false);
  });
});
