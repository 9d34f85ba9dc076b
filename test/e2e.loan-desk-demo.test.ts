import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { expect, it } from 'vitest';
import { ROOT } from './support/loan-desk.js';

const run = promisify(execFile);

// `npm run demo` is `npm run build && node examples/library-loans/demo.js`; the suite runs after a
// build already, and rebuilding dist/ here would pull it from under the other suites' desks.
it('the demo tells the lesson with the expected counts', { timeout: 120_000 }, async () => {
  const { stdout } = await run(process.execPath, ['examples/library-loans/demo.js'], {
    cwd: ROOT,
    timeout: 110_000,
  });
  const section = (title: string) => {
    const start = stdout.indexOf(`--- ${title}`);
    expect(start, title).toBeGreaterThanOrEqual(0);
    const end = stdout.indexOf('\n---', start + 1);
    return stdout.slice(start, end === -1 ? undefined : end);
  };

  const noKey = section('no key, twice');
  expect(noKey.match(/^HTTP\/1\.1 201 Created$/gm)).toHaveLength(2);
  expect(noKey).toContain('"id":1,');
  expect(noKey).toContain('"id":2,');
  expect(noKey).toMatch(/no key x2\s+loan rows: 2$/m);

  const withKey = section('same key, twice');
  expect(withKey.match(/^HTTP\/1\.1 201 Created$/gm)).toHaveLength(2);
  expect(withKey.match(/^idempotency-replayed: true$/gm)).toHaveLength(1);
  expect(withKey).toMatch(/with key x2\s+loan rows: 1$/m);
  expect(withKey).toContain('identical bodies: yes');

  const conflict = section('same key, different body');
  expect(conflict).toMatch(/^status: 409 .*"key_conflict"/m);
  expect(conflict).toMatch(/after conflict\s+loan rows: 1$/m);

  const concurrent = section('five concurrent requests, one key');
  expect(concurrent).toMatch(/statuses\s+: 201 201 201 201 201$/m);
  expect(concurrent).toMatch(/distinct response bodies\s+: 1$/m);
  expect(concurrent).toMatch(/loan rows\s+: 1$/m);

  const aging = section('the key store ages');
  expect(aging).toMatch(/^OD-old {2}sent 30 days ago/m);
  expect(aging).toMatch(/^OD-9c04 {2}age: 0 days$/m);
  expect(aging).not.toMatch(/^OD-old {2}age/m);
  expect(aging).toMatch(/^purged: 1 \(OD-old\)$/m);
  expect(aging).toMatch(/^remaining after cleanup: 1$/m);
  expect(aging).toMatch(/^OD-old again: 201, replayed: no$/m);

  if (existsSync(path.join(ROOT, 'examples/library-loans/faults/lossy-demo.js'))) {
    const lossy = section('a lossy network');
    expect(lossy).toMatch(/with Idempotency-Key: .* -> 100 loans \(0 duplicates\), 100\/100 intents/);
    expect(lossy).toMatch(/without Idempotency-Key: .* -> \d+ loans \(\d+ duplicates\)/);
  }
});
