import { readFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import fc from 'fast-check';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import {
  type AttemptEvent,
  ConfigError,
  createRetryingFetch,
  isRetryBudgetExceededError,
  parseRetryAfterMs,
  RetryBudgetExceededError,
} from '../src/client/index.js';
import { RetrysafeError } from '../src/core/contract/index.js';

/** What the scripted server does with the next request. */
type Answer = { status: number; headers?: Record<string, string>; body?: unknown } | 'reset' | 'hang';

interface Seen {
  method: string;
  key: string | undefined;
  body: string;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

let script: Answer[] = [];
let seen: Seen[] = [];
let url = '';
const server = http.createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (chunk: Buffer) => chunks.push(chunk));
  req.on('end', () => {
    const key = req.headers['idempotency-key'];
    seen.push({
      method: req.method ?? '',
      key: typeof key === 'string' ? key : undefined,
      body: Buffer.concat(chunks).toString(),
    });
    const answer = script.shift() ?? { status: 201, body: { ok: true } };
    if (answer === 'reset') return req.socket.resetAndDestroy();
    if (answer === 'hang') return;
    res.writeHead(answer.status, { 'content-type': 'application/json', ...answer.headers });
    res.end(JSON.stringify(answer.body ?? { status: answer.status }));
  });
});

beforeAll(async () => {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/loans`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});
beforeEach(() => {
  script = [];
  seen = [];
});

const post = { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"member":"U-1001"}' };
const quick = { baseDelayMs: 0, maxDelayMs: 0 };

describe('retries the same intent with the same key', () => {
  const retryable: [string, Answer][] = [
    ['408', { status: 408 }],
    ['429', { status: 429 }],
    ['409 request_in_progress', { status: 409, body: { error: 'request_in_progress' } }],
    ['409 with Retry-After', { status: 409, headers: { 'retry-after': '0' }, body: { error: 'whatever' } }],
    ['502', { status: 502 }],
    ['503', { status: 503 }],
    ['504', { status: 504 }],
    ['a connection reset', 'reset'],
  ];
  it.each(retryable)('after %s', async (_name, answer) => {
    script = [answer, { status: 201, body: { id: 7 } }];
    const response = await createRetryingFetch(quick)(url, post);
    expect(response.status).toBe(201);
    expect(await response.json()).toEqual({ id: 7 });
    expect(seen).toHaveLength(2);
    expect(seen[0]!.key).toMatch(UUID);
    expect(seen[1]!.key).toBe(seen[0]!.key);
    expect(seen[1]!.body).toBe(seen[0]!.body);
  });

  it('after an attempt that timed out', async () => {
    script = ['hang', { status: 201 }];
    const response = await createRetryingFetch({ ...quick, attemptTimeoutMs: 300 })(url, post);
    expect(response.status).toBe(201);
    expect(seen.length).toBeGreaterThanOrEqual(2);
    expect(new Set(seen.map((s) => s.key)).size).toBe(1);
  });
});

describe('never retries a final answer', () => {
  const final: [string, Answer][] = [
    ['409 key_mismatch', { status: 409, body: { error: 'key_mismatch' } }],
    [
      '409 key_mismatch even with Retry-After',
      { status: 409, headers: { 'retry-after': '0' }, body: { error: 'key_mismatch' } },
    ],
    ['409 key_conflict (loan desk)', { status: 409, body: { error: 'key_conflict', key: 'k' } }],
    ['422', { status: 422, body: { error: 'validation', field: 'isbn' } }],
    ['400', { status: 400 }],
    ['404', { status: 404 }],
    ['500', { status: 500 }],
  ];
  it.each(final)('%s is returned after one attempt', async (_name, answer) => {
    script = [answer, { status: 201 }];
    const response = await createRetryingFetch(quick)(url, post);
    expect(response.status).toBe((answer as { status: number }).status);
    expect(seen).toHaveLength(1);
  });
});

describe('Retry-After', () => {
  it('delay-seconds replace the backoff', async () => {
    script = [{ status: 503, headers: { 'retry-after': '1' } }, { status: 201 }];
    const events: AttemptEvent[] = [];
    const response = await createRetryingFetch({ ...quick, onAttempt: (e) => events.push(e) })(url, post);
    expect(response.status).toBe(201);
    expect(events.map((e) => e.delayMs)).toEqual([1000, null]);
  });

  it('an HTTP date is honoured', async () => {
    script = [
      { status: 429, headers: { 'retry-after': new Date(Date.now() + 1500).toUTCString() } },
      { status: 201 },
    ];
    const events: AttemptEvent[] = [];
    await createRetryingFetch({ ...quick, onAttempt: (e) => events.push(e) })(url, post);
    expect(events[0]!.delayMs).toBeGreaterThan(0);
    expect(events[0]!.delayMs).toBeLessThanOrEqual(1500);
    expect(seen).toHaveLength(2);
  });

  it('a wait past the budget ends the call at once instead of sleeping uselessly', async () => {
    script = [{ status: 503, headers: { 'retry-after': '60' } }, { status: 201 }];
    const error = await createRetryingFetch({ ...quick, deadlineMs: 5_000 })(url, post).catch((e) => e);
    expect(error).toBeInstanceOf(RetryBudgetExceededError);
    expect(error.reason).toBe('deadline');
    expect(error.attempts).toBe(1);
    expect(error.lastResponse.status).toBe(503);
    expect(seen).toHaveLength(1);
  });

  it('parses seconds and dates, ignores garbage', () => {
    const nowMs = Date.parse('Sun, 29 Nov 2026 08:00:00 GMT');
    expect(parseRetryAfterMs('3', nowMs)).toBe(3000);
    expect(parseRetryAfterMs(' 0 ', nowMs)).toBe(0);
    expect(parseRetryAfterMs('Sun, 29 Nov 2026 08:00:05 GMT', nowMs)).toBe(5000);
    expect(parseRetryAfterMs('Sun, 29 Nov 2026 07:00:00 GMT', nowMs)).toBe(0);
    expect(parseRetryAfterMs('-1', nowMs)).toBeUndefined();
    expect(parseRetryAfterMs('soon', nowMs)).toBeUndefined();
    expect(parseRetryAfterMs(null, nowMs)).toBeUndefined();
  });
});

describe('the retry budget', () => {
  it('maxAttempts ends with RetryBudgetExceededError carrying the last response', async () => {
    script = Array.from({ length: 10 }, () => ({ status: 503 }));
    const error = await createRetryingFetch({ ...quick, maxAttempts: 3 })(url, post).catch((e) => e);
    expect(isRetryBudgetExceededError(error)).toBe(true);
    expect(error.name).toBe('RetryBudgetExceededError');
    expect(error).toBeInstanceOf(RetrysafeError);
    expect(error).toMatchObject({ reason: 'attempts', attempts: 3, key: seen[0]!.key });
    expect(error.lastResponse.status).toBe(503);
    expect(seen).toHaveLength(3);
  });

  it('deadlineMs ends the call, carrying the last network error as cause', async () => {
    script = Array.from({ length: 1000 }, (): Answer => 'reset');
    const error = await createRetryingFetch({
      baseDelayMs: 20,
      maxDelayMs: 40,
      maxAttempts: 1000,
      deadlineMs: 300,
    })(url, post).catch((e) => e);
    expect(error).toBeInstanceOf(RetryBudgetExceededError);
    expect(error.reason).toBe('deadline');
    // The budget may run out during a wait (cause: the reset) or cut an attempt (cause: the timeout).
    expect(error.cause instanceof TypeError || error.cause.name === 'TimeoutError').toBe(true);
    expect(error.lastResponse).toBeUndefined();
    // The attempt the deadline cut may not have reached the server yet.
    expect(error.attempts - seen.length).toBeGreaterThanOrEqual(0);
    expect(error.attempts - seen.length).toBeLessThanOrEqual(1);
    expect(error.attempts).toBeLessThan(1000);
  });

  it('full jitter stays within min(cap, base * 2^(n-1))', async () => {
    script = Array.from({ length: 8 }, () => ({ status: 503 }));
    const events: AttemptEvent[] = [];
    await createRetryingFetch({
      baseDelayMs: 2,
      maxDelayMs: 20,
      maxAttempts: 8,
      onAttempt: (e) => events.push(e),
    })(url, post).catch(() => {});
    expect(events).toHaveLength(8);
    events.slice(0, 7).forEach((e, i) => {
      expect(e.delayMs).toBeGreaterThanOrEqual(0);
      expect(e.delayMs).toBeLessThanOrEqual(Math.min(20, 2 * 2 ** i));
    });
  });
});

describe('AbortSignal', () => {
  it('an aborted signal sends nothing', async () => {
    const controller = new AbortController();
    controller.abort(new Error('cancelled'));
    await expect(createRetryingFetch()(url, { ...post, signal: controller.signal })).rejects.toThrow(
      'cancelled',
    );
    expect(seen).toHaveLength(0);
  });

  it('aborting during the wait stops at once, with the caller reason', async () => {
    script = [{ status: 503, headers: { 'retry-after': '10' } }];
    const controller = new AbortController();
    const retryingFetch = createRetryingFetch({ onAttempt: () => controller.abort(new Error('user left')) });
    await expect(retryingFetch(url, { ...post, signal: controller.signal })).rejects.toThrow('user left');
    expect(seen).toHaveLength(1);
  });

  it('aborting during an attempt stops it and retries nothing', async () => {
    script = ['hang', { status: 201 }];
    const controller = new AbortController();
    const events: AttemptEvent[] = [];
    const pending = createRetryingFetch({ ...quick, onAttempt: (e) => events.push(e) })(url, {
      ...post,
      signal: controller.signal,
    });
    await expect.poll(() => seen.length).toBe(1);
    controller.abort(new Error('stop'));
    await expect(pending).rejects.toThrow('stop');
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({ attempt: 1, delayMs: null, outcome: { kind: 'error' } });
    expect(seen).toHaveLength(1);
  });
});

describe('keys', () => {
  it('a given key is sent on every attempt', async () => {
    script = [{ status: 503 }, { status: 201 }];
    await createRetryingFetch(quick)(url, { ...post, idempotencyKey: 'OD-7f21' });
    expect(seen.map((s) => s.key)).toEqual(['OD-7f21', 'OD-7f21']);
  });

  it('a key in the headers is the given key; a conflicting option is refused', async () => {
    const retryingFetch = createRetryingFetch(quick);
    await retryingFetch(url, { ...post, headers: { 'Idempotency-Key': 'h-1' } });
    expect(seen[0]!.key).toBe('h-1');
    await expect(
      retryingFetch(url, { ...post, headers: { 'Idempotency-Key': 'h-1' }, idempotencyKey: 'h-2' }),
    ).rejects.toThrow(ConfigError);
  });

  it('each call is a new intent with its own key', async () => {
    const retryingFetch = createRetryingFetch(quick);
    await retryingFetch(url, post);
    await retryingFetch(url, post);
    expect(seen[0]!.key).toMatch(UUID);
    expect(seen[1]!.key).toMatch(UUID);
    expect(seen[1]!.key).not.toBe(seen[0]!.key);
  });

  it.each(['POST', 'PATCH'])(
    'idempotencyKey: false sends no key and never retries %s (it could run twice)',
    async (method) => {
      const retryingFetch = createRetryingFetch(quick);
      script = [{ status: 503 }, { status: 201 }];
      const unavailable = await retryingFetch(url, { ...post, method, idempotencyKey: false });
      expect(unavailable.status).toBe(503);
      script = ['reset', { status: 201 }];
      await expect(retryingFetch(url, { ...post, method, idempotencyKey: false })).rejects.toThrow(TypeError);
      expect(seen.map((s) => [s.method, s.key])).toEqual([
        [method, undefined],
        [method, undefined],
      ]);
    },
  );

  it.each(['GET', 'PUT', 'DELETE'])(
    'idempotencyKey: false still retries %s, idempotent by itself',
    async (method) => {
      script = [{ status: 503 }, { status: 200 }];
      const response = await createRetryingFetch(quick)(url, { method, idempotencyKey: false });
      expect(response.status).toBe(200);
      expect(seen.map((s) => s.key)).toEqual([undefined, undefined]);
    },
  );

  it('other methods carry a key too', async () => {
    await createRetryingFetch(quick)(url, { method: 'PATCH', body: '{}' });
    expect(seen[0]).toMatchObject({ method: 'PATCH', key: expect.stringMatching(UUID) });
  });

  it('a Request input keeps its body and headers across attempts', async () => {
    script = ['reset', { status: 201 }];
    const request = new Request(url, { ...post, headers: { 'idempotency-key': 'req-1' } });
    await createRetryingFetch(quick)(request);
    expect(seen).toEqual([
      { method: 'POST', key: 'req-1', body: post.body },
      { method: 'POST', key: 'req-1', body: post.body },
    ]);
  });
});

it('onAttempt reports every attempt with its outcome and delay', async () => {
  script = [{ status: 503 }, 'reset', { status: 201 }];
  const events: AttemptEvent[] = [];
  await createRetryingFetch({ baseDelayMs: 1, maxDelayMs: 5, onAttempt: (e) => events.push(e) })(url, post);
  expect(events.map((e) => e.attempt)).toEqual([1, 2, 3]);
  expect(new Set(events.map((e) => e.key))).toEqual(new Set([seen[0]!.key]));
  expect(events[0]!.outcome).toEqual({ kind: 'response', status: 503 });
  expect(events[1]!.outcome).toMatchObject({ kind: 'error', error: expect.any(TypeError) });
  expect(events[2]!.outcome).toEqual({ kind: 'response', status: 201 });
  expect(typeof events[0]!.delayMs).toBe('number');
  expect(events[2]!.delayMs).toBeNull();
});

it('options are validated at construction, naming the option', () => {
  expect(() => createRetryingFetch({ maxAttempts: 0 })).toThrow(/maxAttempts/);
  expect(() => createRetryingFetch({ maxAttempts: 1.5 })).toThrow(/maxAttempts/);
  expect(() => createRetryingFetch({ deadlineMs: Number.NaN })).toThrow(/deadlineMs/);
  expect(() => createRetryingFetch({ deadlineMs: 2 ** 31 })).toThrow(/deadlineMs/);
  expect(() => createRetryingFetch({ baseDelayMs: -1 })).toThrow(/baseDelayMs/);
  expect(() => createRetryingFetch({ attemptTimeoutMs: 0 })).toThrow(/attemptTimeoutMs/);
  expect(() => createRetryingFetch({ headerName: 'bad header' })).toThrow(/headerName/);
});

describe('property: one key per call, and the first final answer ends it', () => {
  const answers: Answer[] = [
    'reset',
    { status: 201 },
    { status: 200 },
    { status: 400 },
    { status: 408 },
    { status: 409, body: { error: 'request_in_progress' } },
    { status: 409, body: { error: 'key_mismatch' } },
    { status: 422 },
    { status: 429 },
    { status: 500 },
    { status: 502 },
    { status: 503 },
    { status: 504 },
  ];
  const isRetryable = (a: Answer) =>
    a === 'reset' ||
    [408, 429, 502, 503, 504].includes(a === 'hang' ? 0 : a.status) ||
    (a !== 'hang' && a.status === 409 && (a.body as { error: string }).error === 'request_in_progress');
  const maxAttempts = 6;

  it('holds for any sequence of server answers', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.constantFrom(...answers), { minLength: 1, maxLength: 10 }),
        async (sequence) => {
          script = [...sequence];
          seen = [];
          const outcome = await createRetryingFetch({ ...quick, maxAttempts })(url, post).then(
            (response) => response.status,
            (error: unknown) => error,
          );
          const firstFinal = sequence.findIndex((a) => !isRetryable(a));
          // Past the scripted answers the server says 201, which is final.
          const stopAt = firstFinal === -1 ? sequence.length : firstFinal;
          const expectedAttempts = Math.min(stopAt + 1, maxAttempts);
          expect(seen).toHaveLength(expectedAttempts);
          expect(new Set(seen.map((s) => s.key)).size).toBe(1);
          if (stopAt + 1 > maxAttempts) {
            expect(outcome).toBeInstanceOf(RetryBudgetExceededError);
          } else {
            const final = sequence[stopAt];
            expect(outcome).toBe(
              final === undefined || final === 'reset' || final === 'hang' ? 201 : final.status,
            );
          }
        },
      ),
      { numRuns: 60 },
    );
  });
});

it('the client imports nothing but the errors, the option check and the timer bound, so it runs in browsers as in Node', async () => {
  const source = (path: string) => readFile(new URL(path, import.meta.url), 'utf8');
  const client = await source('../src/client/index.ts');
  const options = await source('../src/core/options/validate.ts');
  const errors = await source('../src/core/contract/errors.ts');
  const timer = await source('../src/core/options/timer.ts');
  expect(client.match(/^import .*$/gm)).toEqual([
    "import { ConfigError, RetrysafeError } from '../core/contract/errors.js';",
    "import { MAX_TIMER_MS, timerMs } from '../core/options/timer.js';",
    "import { checkOptions, optionNames } from '../core/options/validate.js';",
  ]);
  expect(timer).not.toMatch(/^import\s/m);
  expect(options.match(/^import .*$/gm)).toEqual(["import { ConfigError } from '../contract/errors.js';"]);
  expect(errors).not.toMatch(/^import\s/m);
  for (const text of [client, options, errors, timer])
    expect(text).not.toMatch(/\brequire\(|process\.|Buffer\b/);
});

describe('defaults that outlast a server restart within one lease', () => {
  // The server is down for RESTART_MS (connections refused), then the crashed request's key is
  // in progress until its lease (the engine's default, 30 s) passes: each retry meanwhile waits
  // on the server (`wait`, 10 s) and gets 409 + Retry-After: 1; after the lease a retry runs.
  const RESTART_MS = 3_000;
  const LEASE_MS = 30_000;
  const WAIT_MS = 10_000;

  function restartingServer() {
    const startMs = Date.now();
    const attempts: number[] = [];
    const fetch = async (_request: Request, { signal }: { signal: AbortSignal }) => {
      const at = Date.now() - startMs;
      attempts.push(at);
      if (at < RESTART_MS) throw new TypeError('fetch failed', { cause: { code: 'ECONNREFUSED' } });
      if (at < LEASE_MS) {
        await new Promise((resolve) => setTimeout(resolve, Math.min(WAIT_MS, LEASE_MS - at)));
        signal.throwIfAborted();
        if (Date.now() - startMs < LEASE_MS) {
          return Response.json(
            { error: 'request_in_progress' },
            { status: 409, headers: { 'retry-after': '1' } },
          );
        }
      }
      return Response.json({ id: 1 }, { status: 201 });
    };
    return { fetch, attempts };
  }

  afterEach(() => {
    vi.useRealTimers();
    vi.restoreAllMocks();
  });

  // Full jitter draws each wait uniformly below the backoff; 0.1 and 0.5 are an unlucky and a
  // typical draw every time.
  it.each([0.1, 0.5])('jitter draws %d: the call succeeds', async (draw) => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date', 'performance'] });
    vi.spyOn(Math, 'random').mockReturnValue(draw);
    const server = restartingServer();
    const call = createRetryingFetch({ fetch: server.fetch })(url, post);
    const startMs = Date.now();
    let settledAtMs = 0;
    const settled = call.then(
      (response) => response.status,
      (error: Error) => error.message,
    );
    void settled.finally(() => {
      settledAtMs = Date.now() - startMs;
    });
    await vi.advanceTimersByTimeAsync(120_000);
    expect(await settled).toBe(201);
    expect(settledAtMs).toBeGreaterThanOrEqual(LEASE_MS);
  });

  it('maxRetryAfterMs: a longer Retry-After ends the call at once, with the response', async () => {
    script = [{ status: 503, headers: { 'retry-after': '45' } }];
    const error = await createRetryingFetch({ ...quick, maxRetryAfterMs: 10_000 })(url, post).catch(
      (caught: unknown) => caught,
    );
    expect(isRetryBudgetExceededError(error)).toBe(true);
    expect(error).toMatchObject({ reason: 'retryAfter', attempts: 1 });
    expect((error as RetryBudgetExceededError).lastResponse?.status).toBe(503);
    expect(seen).toHaveLength(1);
  });

  it('a Retry-After within maxRetryAfterMs is honoured', async () => {
    script = [{ status: 503, headers: { 'retry-after': '0' } }];
    const response = await createRetryingFetch({ ...quick, maxRetryAfterMs: 0 })(url, post);
    expect(response.status).toBe(201);
  });
});

describe('the client documentation', () => {
  it("states the server's default lease as the engine declares it", async () => {
    const root = new URL('..', import.meta.url);
    const engineDefault = /@default '(\d+)s'\n\s*\* @example lease:/.exec(
      await readFile(new URL('src/core/options/types.ts', root), 'utf8'),
    )?.[1];
    const declared = await readFile(new URL('dist/client/index.d.ts', root), 'utf8');
    expect(engineDefault).toBeDefined();
    expect(/its lease passes \((\d+) s by default/.exec(declared)?.[1]).toBe(engineDefault);
  });
});
