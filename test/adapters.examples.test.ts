import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from './support/free-port.js';

/**
 * The README's quick starts are these files: each runs as a user would (`node examples/<x>/app.js`,
 * importing `retrysafe/*` from dist/, built by test/support/build.ts) and serves one replay.
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
  it('answers 400 without a key, 201 with one, and replays the retry', async () => {
    const url = await startExample(name);
    const order = (key?: string) =>
      fetch(`${url}/orders`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
        body: JSON.stringify({ item: 'book' }),
      });
    expect((await order()).status).toBe(400);
    const first = await order('order-1');
    expect(first.status).toBe(201);
    expect(first.headers.get('location')).toBe('/orders/1');
    const body = await first.json();
    expect(body).toEqual({ id: 1, order: { item: 'book' }, key: 'order-1' });
    const retry = await order('order-1');
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotency-replayed')).toBe('true');
    expect(retry.headers.get('location')).toBe('/orders/1');
    expect(await retry.json()).toEqual(body);
  });
});
