import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, it } from 'vitest';

/** The repository root; the loan desk runs from here and imports `retrysafe/*` from dist/. */
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const LOAN_DESK = path.join(ROOT, 'examples/library-loans/server.js');

export interface StartLoanDeskOptions {
  /**
   * Environment of the desk on top of this process's. `DATABASE_URL` defaults to a fresh SQLite
   * file (see {@link tempDatabaseUrl}); `PORT` to 0 (a free port); `HOST` to 127.0.0.1.
   */
  env?: Record<string, string | undefined>;
  /** `WORKERS`: processes sharing the port through node:cluster. @default 1 */
  workers?: number;
  /** How long to wait for the desk to listen. @default 20_000 */
  startTimeoutMs?: number;
}

export interface LoanDesk {
  /** `http://127.0.0.1:<port>`, no trailing slash. */
  baseUrl: string;
  port: number;
  /** The process started (the cluster primary when `workers` > 1). */
  pid: number;
  /** The `DATABASE_URL` it runs on: pass it to a restart to keep the data. */
  databaseUrl: string;
  /** Everything it printed so far, stdout and stderr interleaved. */
  output(): string;
  /** Resolves with the exit code once the process has exited, sending it nothing. */
  exited(): Promise<number | null>;
  /** SIGTERM (a graceful stop), then SIGKILL if it has not exited within 15 s; resolves with the exit code. */
  stop(): Promise<number | null>;
  /** SIGKILL to the whole process group (primary and workers at once), like a power cut. */
  kill9(): Promise<void>;
}

const live = new Set<ChildProcess>();
let tempDir: string | undefined;

// A failed test must not leave desks listening or temp files behind.
process.once('exit', () => {
  for (const child of live) killGroup(child, 'SIGKILL');
  if (tempDir) rmSync(tempDir, { recursive: true, force: true });
});

function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  try {
    process.kill(-child.pid!, signal);
  } catch {
    // Already gone.
  }
}

/**
 * `describe.each` over the databases a desk can run on (`$name` in `title` names each); one this
 * machine cannot reach shows as a skipped test rather than failing or vanishing.
 */
export function describeEachDatabase<D extends { name: string; skip: boolean }>(
  title: string,
  databases: D[],
  tests: (database: D) => void,
): void {
  describe.each(databases)(title, (database) => {
    if (database.skip) {
      it.skip('needs its database', () => {});
      return;
    }
    tests(database);
  });
}

/** A path for a new SQLite database, in a temp directory removed when this process exits. */
export function tempDatabaseUrl(name = 'library'): string {
  tempDir ??= mkdtempSync(path.join(tmpdir(), 'loan-desk-'));
  return path.join(tempDir, `${name}-${process.pid}-${Math.random().toString(36).slice(2, 10)}.db`);
}

/**
 * One desk for the tests of a describe block: started with `options` before them, stopped after.
 * The function returned gives it to the tests.
 */
export function deskForBlock(options: StartLoanDeskOptions): () => LoanDesk {
  let desk: LoanDesk | undefined;
  beforeAll(async () => {
    desk = await startLoanDesk(options);
  }, 30_000);
  afterAll(() => desk?.stop());
  return () => desk!;
}

/** Runs `test` on a desk started with `options`, then stops the desk, whatever the test did. */
export async function withLoanDesk<T>(
  options: StartLoanDeskOptions,
  test: (desk: LoanDesk) => Promise<T>,
): Promise<T> {
  const desk = await startLoanDesk(options);
  try {
    return await test(desk);
  } finally {
    await desk.stop();
  }
}

function exited(child: ChildProcess): Promise<number | null> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => child.once('exit', (code) => resolve(code)));
}

/**
 * Starts `examples/library-loans/server.js` as a child process in its own process group and
 * resolves once it listens. Needs `npm run build` first (the desk imports retrysafe from dist/).
 * @example
 * const desk = await startLoanDesk({ env: { IDEMPOTENCY_TTL: '2s' } });
 * await fetch(`${desk.baseUrl}/loans`);
 * await desk.stop();
 */
export async function startLoanDesk(options: StartLoanDeskOptions = {}): Promise<LoanDesk> {
  if (!existsSync(path.join(ROOT, 'dist/adapters/node.js'))) {
    throw new Error('startLoanDesk: dist/ is missing; run `npm run build` first');
  }
  const databaseUrl = options.env?.DATABASE_URL ?? tempDatabaseUrl();
  const env: Record<string, string | undefined> = {
    ...process.env,
    HOST: '127.0.0.1',
    PORT: '0',
    ...options.env,
    DATABASE_URL: databaseUrl,
    WORKERS: String(options.workers ?? options.env?.WORKERS ?? 1),
  };
  const child = spawn(process.execPath, [LOAN_DESK], {
    cwd: ROOT,
    env,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  live.add(child);
  child.once('exit', () => live.delete(child));
  let output = '';
  child.stdout!.setEncoding('utf8').on('data', (text: string) => (output += text));
  child.stderr!.setEncoding('utf8').on('data', (text: string) => (output += text));

  const timeoutMs = options.startTimeoutMs ?? 20_000;
  const baseUrl = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => fail(`did not listen within ${timeoutMs} ms`), timeoutMs);
    const onData = () => {
      const match = /loan desk listening on (http:\/\/\S+)/.exec(output);
      if (!match) return;
      cleanup();
      resolve(match[1]!);
    };
    const onExit = (code: number | null, signal: string | null) => fail(`exited (${signal ?? code})`);
    function cleanup() {
      clearTimeout(timer);
      child.stdout!.off('data', onData);
      child.off('exit', onExit);
    }
    function fail(why: string) {
      cleanup();
      killGroup(child, 'SIGKILL');
      reject(new Error(`loan desk ${why}; output:\n${output}`));
    }
    child.stdout!.on('data', onData);
    child.once('exit', onExit);
  });

  return {
    baseUrl,
    port: Number(new URL(baseUrl).port),
    pid: child.pid!,
    databaseUrl,
    output: () => output,
    exited: () => exited(child),
    async stop() {
      const done = exited(child);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => killGroup(child, 'SIGKILL'), 15_000);
      const code = await done;
      clearTimeout(timer);
      return code;
    },
    async kill9() {
      const done = exited(child);
      killGroup(child, 'SIGKILL');
      await done;
    },
  };
}

export interface LoanResponse {
  status: number;
  headers: Headers;
  /** The parsed JSON body (every loan desk answer is JSON). */
  body: any;
  /** The body exactly as received. */
  text: string;
}

/**
 * `POST /loans` with an optional key and bearer token. `body` is sent as given when it is a string
 * (to send malformed JSON), JSON-encoded otherwise.
 */
export async function postLoan(
  baseUrl: string,
  body: unknown,
  options: { key?: string; token?: string; headers?: Record<string, string> } = {},
): Promise<LoanResponse> {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...options.headers };
  if (options.key !== undefined) headers['idempotency-key'] = options.key;
  if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`;
  const response = await fetch(`${baseUrl}/loans`, {
    method: 'POST',
    headers,
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return read(response);
}

/** `GET` a path of the desk (`/loans`, `/books`, `/loans/1`). */
export async function getJson(baseUrl: string, pathname: string): Promise<LoanResponse> {
  return read(await fetch(`${baseUrl}${pathname}`));
}

async function read(response: Response): Promise<LoanResponse> {
  const text = await response.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  return { status: response.status, headers: response.headers, body, text };
}

/** The loans the desk holds, through `GET /loans`. */
export async function listLoans(baseUrl: string): Promise<Array<Record<string, unknown>>> {
  const { status, body } = await getJson(baseUrl, '/loans');
  if (status !== 200) throw new Error(`GET /loans answered ${status}`);
  return body;
}
