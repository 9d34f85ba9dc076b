import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { cpSync, existsSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { expect } from 'vitest';
import { freePort } from './free-port.js';

// The package as a user gets it (`npm pack`) and a README quick start's promise checked over HTTP:
// shared by the packed-package test and the Web-standard runtimes' (Bun, Deno, Next.js).

const root = join(import.meta.dirname, '../..');

export const run = (cmd: string, args: string[], cwd: string, timeout = 120_000) =>
  execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout });

/**
 * Type-checks the files `include` names in `dir` as a user's strict ES-module project would
 * (module nodenext), `compilerOptions` on top, with the compiler at `tsc` (…/typescript/bin/tsc):
 * what tsc reports, empty when it found nothing.
 */
export function typeCheckAsUser(
  dir: string,
  tsc: string,
  compilerOptions: object,
  include: string[],
): string {
  writeFileSync(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        target: 'ES2022',
        module: 'nodenext',
        moduleResolution: 'nodenext',
        strict: true,
        types: ['node'],
        ...compilerOptions,
      },
      include,
    }),
  );
  try {
    run(process.execPath, [tsc, '-p', dir], dir);
    return '';
  } catch (error) {
    return String((error as { stdout?: string }).stdout);
  }
}

/** This repository's files as a clone has them in `dir`: tracked or new, never ignored (no dist/). */
function freshCheckout(dir: string): string {
  const paths = run('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], root).split(
    '\0',
  );
  for (const path of paths.filter((p) => p !== '' && existsSync(join(root, p)))) {
    cpSync(join(root, path), join(dir, path));
  }
  symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'), 'dir');
  return dir;
}

/** The tarball `npm pack` writes into the checkout, as the README's Quick start names it. */
export const TARBALL = `retrysafe-${(JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string }).version}.tgz`;

/**
 * Packs this repository into `dir` as the README's Quick start tells a user to: plain `npm pack`
 * in a fresh checkout (its `prepack` builds dist/), which writes {@link TARBALL} there. The
 * tarball's path, the files it ships, and the checkout.
 */
export function pack(dir: string): { tarball: string; files: string[]; checkout: string } {
  const checkout = freshCheckout(join(dir, 'checkout'));
  // prepack builds dist/ with tsc: minutes on a loaded machine.
  run('npm', ['pack'], checkout, 300_000);
  const tarball = join(checkout, TARBALL);
  const files = run('tar', ['-tzf', tarball], checkout)
    .split('\n')
    .filter((line) => line !== '' && !line.endsWith('/'))
    .map((line) => line.replace(/^package\//, ''));
  return { tarball, files, checkout };
}

export interface QuickStartServer {
  /** The command and its arguments; PORT and HOST are set in its environment. */
  command: string;
  args: string[];
  cwd: string;
  env?: Record<string, string>;
  /** The line on stdout that says the server listens; `listening on` unless told. */
  ready?: RegExp;
  /** Checks the server at its URL instead of the one replay (e.g. {@link checkQuickStart}). */
  check?: (url: string) => Promise<void>;
}

/**
 * Starts a quick start's server on a free loopback port, checks its promise (400 without a key,
 * then 201 and a replay of it under one key), and stops it. `key` names the operation.
 */
export async function serveOneReplay(server: QuickStartServer, key = 'order-1'): Promise<void> {
  const port = await freePort();
  const child: ChildProcess = spawn(server.command, server.args, {
    cwd: server.cwd,
    env: { ...process.env, ...server.env, PORT: String(port), HOST: '127.0.0.1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stderr!.on('data', (chunk) => {
    output += chunk;
  });
  const ready = server.ready ?? /listening on/;
  try {
    await new Promise<void>((resolve, reject) => {
      child.once('exit', (code) => reject(new Error(`${server.command} exited with ${code}:\n${output}`)));
      createInterface({ input: child.stdout! }).on('line', (line) => {
        output += `${line}\n`;
        if (ready.test(line)) resolve();
      });
    });
    if (server.check) {
      await server.check(`http://127.0.0.1:${port}`);
      return;
    }
    const order = (withKey?: string) =>
      fetch(`http://127.0.0.1:${port}/orders`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(withKey ? { 'idempotency-key': withKey } : {}) },
        body: JSON.stringify({ item: 'book' }),
        signal: AbortSignal.timeout(15_000),
      });
    expect((await order()).status).toBe(400);
    const first = await order(key);
    expect(first.status).toBe(201);
    const body = await first.json();
    expect(body).toEqual({ id: 1, order: { item: 'book' }, key });
    const retry = await order(key);
    expect(retry.headers.get('idempotency-replayed')).toBe('true');
    expect(await retry.json()).toEqual(body);
  } finally {
    const exited = new Promise((resolve) => child.once('exit', resolve));
    if (child.exitCode === null && child.signalCode === null) {
      child.kill();
      await exited;
    }
  }
}

/** Bodies a careful quick start refuses with a 400 of its own, before any order is taken. */
export const BAD_BODIES = [
  { name: 'invalid JSON', contentType: 'application/json', body: '{"item":' },
  { name: 'an empty body', contentType: 'application/json', body: '' },
  { name: 'text/plain', contentType: 'text/plain', body: 'hello' },
] as const;

/**
 * A quick start's promise, at `url`: 400 without a key; 400 with a JSON error for each bad body,
 * which leaves the order counter and the key alone (a 400 is not stored, so the corrected request
 * runs under the same key); then 201 for the first good order, and its retry replayed.
 */
export async function checkQuickStart(url: string, key = 'order-1'): Promise<void> {
  const order = (
    withKey?: string,
    contentType = 'application/json',
    body = JSON.stringify({ item: 'book' }),
  ) =>
    fetch(`${url}/orders`, {
      method: 'POST',
      headers: { 'content-type': contentType, ...(withKey ? { 'idempotency-key': withKey } : {}) },
      body,
    });
  expect((await order()).status).toBe(400);
  for (const bad of BAD_BODIES) {
    const refused = await order(key, bad.contentType, bad.body);
    expect(refused.status, bad.name).toBe(400);
    expect(refused.headers.get('content-type'), bad.name).toMatch(/^application\/json/);
    expect(await refused.json(), bad.name).toMatchObject({ error: expect.any(String) });
  }
  const first = await order(key);
  expect(first.status).toBe(201);
  expect(first.headers.get('location')).toBe('/orders/1');
  const body = await first.json();
  expect(body).toEqual({ id: 1, order: { item: 'book' }, key });
  const retry = await order(key);
  expect(retry.status).toBe(201);
  expect(retry.headers.get('idempotency-replayed')).toBe('true');
  expect(retry.headers.get('location')).toBe('/orders/1');
  expect(await retry.json()).toEqual(body);
}
