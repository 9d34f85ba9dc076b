import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, describe, it } from 'vitest';
import { freePort } from './support/free-port.js';
import { checkQuickStart } from './support/quick-start.js';

/**
 * The README's quick starts are these files: each runs as a user would (`node examples/<x>/app.js`,
 * importing `retrysafe/*` from dist/, built by test/support/build.ts), refuses bodies it cannot read
 * and serves one replay.
 */
const root = join(import.meta.dirname, '..');
const children: ChildProcess[] = [];
const dirs: string[] = [];

afterAll(() => {
  for (const child of children) child.kill();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

async function startExample(name: string): Promise<string> {
  const cwd = mkdtempSync(join(tmpdir(), `retrysafe-example-${name}-`));
  dirs.push(cwd);
  const child = spawn(process.execPath, [join(root, 'examples', name, 'app.js')], {
    cwd,
    env: { ...process.env, PORT: String(await freePort()), HOST: '127.0.0.1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let stderr = '';
  child.stderr!.on('data', (chunk) => {
    stderr += chunk;
  });
  const lines = createInterface({ input: child.stdout! });
  return new Promise((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`examples/${name} exited with ${code}:\n${stderr}`)));
    lines.on('line', (line) => {
      const port = /listening on http:\/\/localhost:(\d+)/.exec(line)?.[1];
      if (port) resolve(`http://127.0.0.1:${port}`);
    });
  });
}

describe.each(['node', 'express', 'fastify', 'hono', 'koa', 'nestjs'])('examples/%s/app.js', (name) => {
  it('answers 400 without a key or to a body it cannot read, 201 with one, and replays the retry', async () => {
    await checkQuickStart(await startExample(name));
  });
});
