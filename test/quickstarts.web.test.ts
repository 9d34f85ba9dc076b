import { randomUUID } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { pack, run, serveOneReplay } from './support/quick-start.js';
import { hasRedis, REDIS_URL } from './support/services.js';

/**
 * The Web-standard quick starts (examples/fetch) as a user runs them: the packed tarball and the
 * runtimes' own npm packages (`bun`, `deno`, whose binaries ship in platform packages) installed
 * into a fresh project; the driver (ioredis) linked from this repository's node_modules.
 */
const root = join(import.meta.dirname, '..');
const work = mkdtempSync(join(tmpdir(), 'retrysafe-web-'));
const RUNTIMES = {
  bun: ['node_modules/.bin/bun', 'bun.js'],
  deno: ['node_modules/.bin/deno', 'run', '--allow-net=127.0.0.1', '--allow-env', 'deno.js'],
} as const;
const keys: string[] = [];
let dir: string;

beforeAll(() => {
  const { tarball } = pack(work);
  dir = join(work, 'web');
  mkdirSync(dir);
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'web', private: true, type: 'module' }));
  run(
    'npm',
    ['install', tarball, 'bun', 'deno', '--prefer-offline', '--no-audit', '--no-fund'],
    dir,
    240_000,
  );
  symlinkSync(join(root, 'node_modules/ioredis'), join(dir, 'node_modules/ioredis'), 'dir');
  for (const file of ['orders.js', 'bun.js', 'deno.js'])
    copyFileSync(join(root, 'examples/fetch', file), join(dir, file));
}, 300_000);

afterAll(async () => {
  rmSync(work, { recursive: true, force: true });
  if (!hasRedis || keys.length === 0) return;
  const admin = new Redis(REDIS_URL);
  for (const key of keys) {
    for await (const found of admin.scanStream({ match: `*${key}*`, count: 500 })) {
      if ((found as string[]).length > 0) await admin.del(...(found as string[]));
    }
  }
  await admin.quit();
});

describe.each(Object.entries(RUNTIMES))(
  'the %s quick start (examples/fetch)',
  (_runtime, [command, ...args]) => {
    it('with the memory store: 400 without a key, then a replay', { timeout: 60_000 }, async () => {
      await serveOneReplay({ command: join(dir, command), args, cwd: dir });
    });

    it.skipIf(!hasRedis)(
      'with the Redis store (ioredis): 400 without a key, then a replay',
      { timeout: 60_000 },
      async () => {
        const key = `order-${randomUUID()}`;
        keys.push(key);
        await serveOneReplay({ command: join(dir, command), args, cwd: dir, env: { REDIS_URL } }, key);
      },
    );
  },
);
