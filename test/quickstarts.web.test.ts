import { randomUUID } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { checkQuickStart, pack, run, serveOneReplay } from './support/quick-start.js';
import { hasRedis, REDIS_URL } from './support/services.js';

/**
 * The Web-standard quick starts as a user runs them, each in a fresh project: the packed tarball
 * and what the quick start needs from the npm registry (`bun` and `deno`, whose binaries ship in
 * platform packages); the driver (ioredis) linked from this repository's node_modules (Next.js:
 * test/examples.nextjs.test.ts). Installs prefer npm's cache, so only a first run downloads.
 */
const root = join(import.meta.dirname, '..');
const work = mkdtempSync(join(tmpdir(), 'retrysafe-web-'));
const RUNTIMES = {
  bun: ['node_modules/.bin/bun', 'bun.js'],
  deno: ['node_modules/.bin/deno', 'run', '--allow-net=127.0.0.1', '--allow-env', 'deno.js'],
} as const;
const keys: string[] = [];
let tarball: string;
let dir: string;

/** A fresh project in `work` with the tarball and `packages` installed. */
function project(name: string, packages: string[]): string {
  const path = join(work, name);
  mkdirSync(path);
  writeFileSync(join(path, 'package.json'), JSON.stringify({ name, private: true, type: 'module' }));
  run('npm', ['install', tarball, ...packages, '--prefer-offline', '--no-audit', '--no-fund'], path, 240_000);
  return path;
}

beforeAll(() => {
  ({ tarball } = pack(work));
  dir = project('web', ['bun', 'deno']);
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
    it('with the memory store: 400 without a key or with a bad body, then a replay', {
      timeout: 60_000,
    }, async () => {
      await serveOneReplay({
        command: join(dir, command),
        args,
        cwd: dir,
        check: (url) => checkQuickStart(url),
      });
    });

    it.skipIf(!hasRedis)(
      'with the Redis store (ioredis): 400 without a key or with a bad body, then a replay',
      { timeout: 60_000 },
      async () => {
        const key = `order-${randomUUID()}`;
        keys.push(key);
        const check = (url: string) => checkQuickStart(url, key);
        await serveOneReplay({ command: join(dir, command), args, cwd: dir, env: { REDIS_URL }, check });
      },
    );
  },
);
