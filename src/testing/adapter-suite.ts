import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Worker } from 'node:worker_threads';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createIdempotency } from '../core/adapter.js';
import type { IdempotencyEvent } from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import { type IdempotencyOptions, IETF_DRAFT_ERRORS_URL } from '../core/options/index.js';
import { credentialScope } from '../core/request/index.js';
import {
  type AbandonedRecord,
  type ClaimInput,
  type IdempotencyStore,
  isAtomicStore,
} from '../core/store.js';
import { exchange, type RawOutcome, type RawRequest } from './raw-http.js';

/**
 * A store to run tests against, one of each kind below: `open` makes a new one on data of its
 * own (a temp file, a schema, a database, a key prefix), which `cleanup` removes after the caller
 * closed the store.
 */
export interface StoreFactory {
  name: string;
  /** The store implements `atomic`: the atomic-mode scenarios run too. */
  atomic?: boolean;
  /** `false` when the store's database is unreachable here: its block is skipped. */
  available?: boolean;
  open(): Promise<{ store: IdempotencyStore; cleanup?: () => Promise<void> }>;
}

/** The catalog's POST-only paths (besides `/parser-after`, served with `bodyParsers: 'after'` only). */
export const CATALOG_POST_PATHS = [
  '/text',
  '/buffer',
  '/stream',
  '/fail',
  '/slow',
  '/empty',
  '/gzip',
  '/form',
];

/** An adapter's app for {@link describeAdapterConformance}: how it starts, where its body parsers sit. */
export interface AdapterUnderTest {
  name: string;
  throwPaths: readonly string[];
  /**
   * Where the app's body parsers sit. `'before'`: JSON and form parsers run before the middleware,
   * which fingerprints what they parsed. `'after'`: none runs before it, so the middleware reads
   * the body itself, and the app serves `POST /parser-after`. Omitted: the framework parses when
   * the handler asks, after the middleware read the bytes (node:http, Hono, Fastify).
   */
  bodyParsers?: 'before' | 'after';
  start(options: AppOptions): Promise<RunningApp>;
}

/**
 * The engine options. `scope` is one that ignores the request (the request type differs per
 * framework); `scopeByAuthorization` switches to scope = the Authorization header.
 */
export type AppOptions = Omit<IdempotencyOptions, 'scope'> & {
  scope?: () => string;
  scopeByAuthorization?: boolean;
};

/** An app {@link AdapterUnderTest.start} started, listening on loopback. */
export interface RunningApp {
  /** `http://127.0.0.1:<port>` */
  url: string;
  /** Handler calls by `"<METHOD> <path>"`, path without query. */
  calls: Record<string, number>;
  /**
   * A completer's `resume` through this app (the guard's `resumeThrough(app)`); without it the
   * scenario of an abandoned operation finished through the app is skipped.
   */
  resume?: (record: AbandonedRecord, signal?: AbortSignal) => Promise<unknown>;
  close(): Promise<void>;
}

/** Counts a handler call of `method` and `path` in `calls` and returns its number (1 for the first). */
export function countCall(calls: Record<string, number>, method: string, path: string): number {
  const name = `${method.toUpperCase()} ${path}`;
  calls[name] = (calls[name] ?? 0) + 1;
  return calls[name];
}

/** Bytes that differ per call and are not valid UTF-8, so a replay must be byte-exact. */
export function pattern(n: number, size: number): Buffer {
  const bytes = Buffer.alloc(size);
  for (let i = 0; i < size; i++) bytes[i] = (i * 7 + n * 31 + 0x80) & 0xff;
  return bytes;
}

/** The headers of the `n`th order: location, etag, set-cookie (never replayed) and x-trace. */
export function orderHeaders(n: number): Record<string, string> {
  return { location: `/orders/${n}`, etag: `"${n}"`, 'set-cookie': `sid=${n}`, 'x-trace': String(n) };
}

/** The JSON body of the `n`th order, with what the handler saw of its context and body. */
export function orderJson(n: number, ctx: IdempotencyContext | undefined, received: unknown) {
  return {
    n,
    key: ctx?.key ?? null,
    tx: ctx?.tx !== undefined,
    charge: ctx?.downstreamKey('charge') ?? null,
    received: received ?? null,
  };
}

/** A JSON body as the handler received it: a Buffer or string is parsed, anything else kept. */
export function parsedJson(body: unknown): unknown {
  if (body === undefined || body === null) return null;
  const text =
    typeof body === 'string' ? body : body instanceof Uint8Array ? Buffer.from(body).toString() : null;
  if (text === null) return body;
  if (text === '') return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** The body as text when the handler got bytes or a string; `undefined` for a parsed value. */
function textOf(body: unknown): string | undefined {
  if (typeof body === 'string') return body;
  return body instanceof Uint8Array ? Buffer.from(body).toString() : undefined;
}

/** The size of each chunk `POST /stream` sends. */
export const STREAM_CHUNK_BYTES = 1024;

/**
 * What the catalog route answers, decided once for every framework; each harness sends it in its
 * framework's idiom. Counts the call. `delayMs` is waited before answering; `fail` means the
 * handler must fail in its path's idiom.
 */
export type Planned = { status: number; headers: Record<string, string>; delayMs?: number } & (
  | { kind: 'json'; json: unknown }
  | { kind: 'text'; text: string }
  | { kind: 'bytes'; bytes: Buffer }
  | { kind: 'stream'; chunks: Buffer[] }
  | { kind: 'empty' }
  | { kind: 'fail' }
);

/**
 * What a catalog route answers for `method` and `url` (see {@link Planned}): each harness's routes
 * call it and send its answer in the framework's idiom.
 */
export function plan(
  calls: Record<string, number>,
  method: string,
  url: URL,
  ctx: IdempotencyContext | undefined,
  received: unknown,
): Planned {
  const path = url.pathname;
  const n = countCall(calls, method, path);
  const size = Number(url.searchParams.get('size') ?? 3000);
  const order: Planned = {
    kind: 'json',
    status: 201,
    headers: orderHeaders(n),
    json: orderJson(n, ctx, parsedJson(received)),
  };
  if (path === '/orders') {
    if (method !== 'POST' && method !== 'PATCH') {
      return { kind: 'json', status: 200, headers: {}, json: { n, key: ctx?.key ?? null } };
    }
    const refusal = (parsedJson(received) as { status?: unknown } | null)?.status;
    return typeof refusal === 'number'
      ? { kind: 'json', status: refusal, headers: {}, json: { error: 'refused', n } }
      : order;
  }
  const octets = { 'content-type': 'application/octet-stream' };
  switch (path) {
    case '/text':
      return {
        kind: 'text',
        status: 200,
        headers: { 'content-type': 'text/plain; charset=utf-8' },
        text: `made ${n}`,
      };
    case '/buffer':
      return { kind: 'bytes', status: 200, headers: octets, bytes: pattern(n, size) };
    case '/stream': {
      const bytes = pattern(n, size);
      const chunks: Buffer[] = [];
      for (let i = 0; i < size; i += STREAM_CHUNK_BYTES)
        chunks.push(bytes.subarray(i, i + STREAM_CHUNK_BYTES));
      return { kind: 'stream', status: 200, headers: octets, chunks };
    }
    case '/fail':
      return n === 1 ? { kind: 'json', status: 500, headers: {}, json: { error: 'boom' } } : order;
    case '/slow':
      return { ...order, delayMs: Number(url.searchParams.get('ms') ?? 100) };
    case '/empty':
      return { kind: 'empty', status: 204, headers: { 'x-trace': String(n) } };
    case '/form': {
      const text = textOf(received);
      const form =
        text === undefined ? { ...(received as object) } : Object.fromEntries(new URLSearchParams(text));
      return {
        kind: 'json',
        status: 201,
        headers: {},
        json: { n, form, parsedByFramework: text === undefined },
      };
    }
    case '/parser-after': {
      const text = received instanceof Uint8Array ? `buffer:${textOf(received)}` : received;
      return { kind: 'json', status: 201, headers: {}, json: { n, received: text } };
    }
    case '/gzip':
      return {
        kind: 'bytes',
        status: 200,
        headers: { 'content-type': 'application/json', 'content-encoding': 'gzip', vary: 'Accept-Encoding' },
        bytes: gzipSync(JSON.stringify({ n })),
      };
    default:
      return n === 1 ? { kind: 'fail', status: 500, headers: {} } : order;
  }
}

/** Chunks with a macrotask between them, so a stream really arrives in pieces. */
export async function* paced(chunks: readonly Buffer[]): AsyncGenerator<Buffer> {
  for (const chunk of chunks) {
    yield chunk;
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** {@link paced} as a Web `ReadableStream`, for Web-standard handlers (Hono, fetch). */
export function pacedStream(chunks: readonly Buffer[]): ReadableStream<Uint8Array> {
  const source = paced(chunks);
  return new ReadableStream({
    async pull(controller) {
      const next = await source.next();
      if (next.done) controller.close();
      else controller.enqueue(new Uint8Array(next.value));
    },
  });
}

/** Listens on an ephemeral loopback port; `close` also drops keep-alive connections. */
export async function listen(
  server: Server,
  calls: Record<string, number>,
  resume?: RunningApp['resume'],
): Promise<RunningApp> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    calls,
    resume,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

interface Reply {
  status: number;
  headers: Headers;
  body: Buffer;
  json(): any;
}

interface SendOptions {
  key?: string;
  body?: unknown;
  headers?: Record<string, string>;
}

async function send(
  app: RunningApp,
  method: string,
  path: string,
  options: SendOptions = {},
): Promise<Reply> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.key !== undefined) headers['idempotency-key'] = options.key;
  let body: string | undefined;
  if (options.body !== undefined) {
    body = typeof options.body === 'string' ? options.body : JSON.stringify(options.body);
    headers['content-type'] ??= 'application/json';
  }
  const res = await fetch(app.url + path, { method, headers, body, signal: AbortSignal.timeout(15_000) });
  const bytes = Buffer.from(await res.arrayBuffer());
  return { status: res.status, headers: res.headers, body: bytes, json: () => JSON.parse(bytes.toString()) };
}

/** An HTTP/1.1 request written byte for byte, for headers fetch refuses to send. */
function rawPost(
  app: RunningApp,
  path: string,
  headerLines: Buffer[],
): Promise<{ status: number; text: string }> {
  const { port } = new URL(app.url);
  const body = Buffer.from('{"a":1}');
  const request = Buffer.concat([
    Buffer.from(`POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n`),
    ...headerLines.flatMap((line) => [line, Buffer.from('\r\n')]),
    Buffer.from(`Content-Length: ${body.length}\r\nConnection: close\r\n\r\n`),
    body,
  ]);
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), '127.0.0.1');
    const chunks: Buffer[] = [];
    socket.setTimeout(10_000, () => socket.destroy(new Error('raw request timed out')));
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('error', reject);
    socket.on('close', () => {
      const text = Buffer.concat(chunks).toString('latin1');
      resolve({ status: Number(text.split(' ')[1]), text });
    });
    // Not end(): a server may drop a half-closed connection before a slow store lets it answer;
    // `Connection: close` makes it close once it has.
    socket.write(request);
  });
}

/**
 * `count` fetch POSTs of a JSON body of `bytes` bytes, one after another, each with a new key,
 * sent from a worker thread: a client on the server's own event loop never writes while the
 * server closes, so it would not see the resets a client in another process sees. Every other
 * upload is streamed (chunked, no Content-Length), so a limit found mid-body is tried too.
 * Resolves with each status, or the code of the network error that replaced it.
 */
export async function uploadFromAnotherThread(
  app: RunningApp,
  path: string,
  count: number,
  bytes: number,
): Promise<Array<number | string>> {
  const worker = new Worker(
    `
    const { parentPort, workerData } = require('node:worker_threads');
    const { randomUUID } = require('node:crypto');
    (async () => {
      const body = JSON.stringify({ pad: 'x'.repeat(workerData.bytes) });
      const outcomes = [];
      for (let i = 0; i < workerData.count; i++) {
        try {
          const res = await fetch(workerData.url, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'idempotency-key': 'k-' + randomUUID() },
            body: i % 2 === 0 ? body : new Blob([body]).stream(),
            duplex: 'half',
            signal: AbortSignal.timeout(15000),
          });
          await res.arrayBuffer();
          outcomes.push(res.status);
        } catch (error) {
          outcomes.push(error.cause?.code ?? String(error));
        }
      }
      parentPort.postMessage(outcomes);
    })();
    `,
    { eval: true, workerData: { url: app.url + path, count, bytes } },
  );
  try {
    return await new Promise((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
    });
  } finally {
    await worker.terminate();
  }
}

async function until(condition: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 1000; i++) {
    if (condition()) return;
    await sleep(10);
  }
  throw new Error(`timed out waiting for ${what}`);
}

/**
 * Three POSTs of a 900 KiB JSON body written in three pieces over `Connection: close`, each with
 * `headers` besides its Content-Type: each its status (or how it failed). Found by the adapter
 * fuzz (test/fuzz): a request refused before its body was read (a bad key, a body declared too
 * large) was answered, then the connection closed on the unread upload and was reset, so the
 * answer was lost.
 */
async function refusedLargeUpload(
  app: RunningApp,
  headers: RawRequest['headers'],
  framing: RawRequest['framing'] = { kind: 'length' },
): Promise<Array<number | RawOutcome>> {
  const statuses: Array<number | RawOutcome> = [];
  for (let i = 0; i < 3; i++) {
    const outcome = await exchange(Number(new URL(app.url).port), {
      method: 'POST',
      target: '/orders',
      headers: [...headers, ['Content-Type', 'application/json']],
      body: Buffer.from(JSON.stringify({ pad: 'x'.repeat(900 * 1024) })),
      framing,
      cuts: [0.01, 0.5],
      hangUp: { at: 'never' },
    });
    statuses.push(outcome.kind === 'reply' ? outcome.reply.status : outcome);
  }
  return statuses;
}

/**
 * Waits until `key` (of the default scope) is no longer in progress: its handler's answer saved,
 * or the key released. A key held for ever fails here, after a margin no handler here needs.
 */
export async function settled(store: IdempotencyStore, key: string): Promise<void> {
  for (let i = 0; i < 1000; i++) {
    if ((await store.get(credentialScope(undefined), key))?.state !== 'in_progress') return;
    await sleep(10);
  }
  throw new Error(`key ${key} still in progress`);
}

const newKey = () => `k-${randomUUID()}`;

function expectError(reply: Reply, status: number, code: string): void {
  expect(reply.status).toBe(status);
  expect(reply.headers.get('content-type')).toMatch(/^application\/json/);
  expect(reply.json()).toMatchObject({ error: code });
  expect(reply.headers.get('idempotency-replayed')).toBeNull();
}

function expectReplayOf(replay: Reply, original: Reply): void {
  expect(replay.status).toBe(original.status);
  expect(replay.headers.get('idempotency-replayed')).toBe('true');
  expect(original.headers.get('idempotency-replayed')).toBeNull();
  expect(replay.body.equals(original.body)).toBe(true);
  for (const name of ['content-type', 'location', 'etag']) {
    expect(replay.headers.get(name), name).toBe(original.headers.get(name));
  }
}

/** Engine store-contract doubles: a store whose every call rejects, and one that never answers. */
function brokenStore(kind: 'failing' | 'hanging'): IdempotencyStore {
  const fail = () =>
    kind === 'failing' ? Promise.reject(new Error('connection refused')) : new Promise<never>(() => {});
  return {
    name: kind,
    claim: fail,
    complete: fail,
    release: fail,
    saveStep: fail,
    abandoned: fail,
    renew: fail,
    wait: fail,
    purgeExpired: fail,
    list: fail,
    get: fail,
    delete: fail,
    close: async () => undefined,
  };
}

const MALFORMED_KEYS: ReadonlyArray<[string, Buffer[]]> = [
  ['empty', [Buffer.from('Idempotency-Key: ')]],
  ['too long (256 characters)', [Buffer.from(`Idempotency-Key: ${'a'.repeat(256)}`)]],
  ['a control character', [Buffer.from('Idempotency-Key: a\x01b', 'latin1')]],
  ['DEL', [Buffer.from('Idempotency-Key: a\x7fb', 'latin1')]],
  ['non-ASCII', [Buffer.from('Idempotency-Key: clé', 'utf8')]],
  ['two headers', [Buffer.from('Idempotency-Key: a'), Buffer.from('Idempotency-Key: b')]],
  ['a bad sf-string (unterminated)', [Buffer.from('Idempotency-Key: "abc')]],
  ['a bad sf-string (bad escape)', [Buffer.from('Idempotency-Key: "a\\qb"')]],
  ['a sf-string with parameters', [Buffer.from('Idempotency-Key: "abc";p=1')]],
];

/**
 * The adapter conformance suite: one list of HTTP scenarios (every row of the HTTP outcomes in docs/reference.md, bad keys,
 * large and streamed bodies, concurrent duplicates, handler errors, scopes, pass-through and the
 * known failure modes of other middlewares), run over real HTTP against every adapter and store.
 *
 * Each adapter has an {@link AdapterUnderTest} (ours: test/conformance/apps/): an app written in
 * that framework's own idiom, guarded app-wide by the options it is given, serving this catalog
 * (`n` is the handler's call count for that method and path, from {@link countCall}):
 *
 * - `POST|PATCH /orders`: 201, JSON {@link orderJson} sent the framework's usual way, with headers
 *   {@link orderHeaders} (location, etag, set-cookie, x-trace). A JSON body `{"status":S}` is
 *   refused instead, as a validating handler would: S, JSON `{"error":"refused","n":n}`.
 * - `GET|HEAD|PUT|DELETE /orders`: 200, JSON `{"n":n,"key":<ctx key or null>}`.
 * - `POST /text`: 200 `text/plain; charset=utf-8` `made <n>`.
 * - `POST /buffer?size=S`: 200 `application/octet-stream`, `pattern(n, S)` sent in one piece.
 * - `POST /stream?size=S`: the same bytes, streamed in 1 KiB chunks with a macrotask between.
 * - `POST /fail`: 500 JSON `{"error":"boom"}` on its first call, then as `/orders`.
 * - `POST /slow?ms=M`: waits M ms, then as `/orders`.
 * - `POST /empty`: 204 with header `x-trace: <n>` and no body.
 * - `POST /gzip`: 200, JSON `{"n":n}` gzip-encoded, with `content-encoding: gzip` and
 *   `vary: Accept-Encoding`, as a compression middleware inside ours would hand it on.
 * - `POST /form`: a form-encoded body, parsed the framework's way (see `bodyParsers`): 201, JSON
 *   `{"n":n,"form":<its fields>,"parsedByFramework":<the handler got a value, not bytes>}`.
 * - `POST /parser-after`, with `bodyParsers: 'after'` only: the framework's JSON parser mounted
 *   after the middleware; 201, JSON `{"n":n,"received":"buffer:<body>"}` for the Buffer the
 *   middleware left (anything else as received).
 * - every path of `throwPaths`: fails on its first call in one of the framework's error idioms
 *   (sync throw, rejected promise, `next(err)`…), then as `/orders`.
 *
 * Keys are random per test, so one store serves a whole describe block. Timing: nothing asserts
 * how long anything took; ordering is established by polling the handler's call count.
 *
 * Runs every scenario against `adapter`, once per store.
 */
export function describeAdapterConformance(adapter: AdapterUnderTest, stores: readonly StoreFactory[]): void {
  for (const factory of stores) {
    describe.skipIf(factory.available === false)(
      `adapter conformance: ${adapter.name} + ${factory.name}`,
      () => {
        let store: IdempotencyStore;
        let cleanup: (() => Promise<void>) | undefined;
        beforeAll(async () => {
          ({ store, cleanup } = await factory.open());
        });
        afterAll(async () => {
          await store?.close();
          await cleanup?.();
        });

        async function withApp(options: Partial<AppOptions>, body: (app: RunningApp) => Promise<void>) {
          const app = await adapter.start({ store, ...options });
          try {
            await body(app);
          } finally {
            await app.close();
          }
        }

        it('no key on an optional route: the handler runs every time', () =>
          withApp({}, async (app) => {
            const first = await send(app, 'POST', '/orders', { body: { a: 1 } });
            const second = await send(app, 'POST', '/orders', { body: { a: 1 } });
            expect([first.status, second.status]).toEqual([201, 201]);
            // The body is the app's business here: an app without a body parser never sees it.
            expect(first.json()).toMatchObject({ n: 1, key: null, tx: false });
            expect(second.json().n).toBe(2);
            expect(second.headers.get('idempotency-replayed')).toBeNull();
          }));

        it('an abandoned operation is finished through the app (resumeThrough); the late retry replays it', (test) =>
          withApp({}, async (app) => {
            if (app.resume === undefined) return test.skip();
            const key = newKey();
            const body = { a: 1 };
            const record = await abandon(store, key, '/orders', body);
            const outcome = (await app.resume(record)) as { kind: string; response: { body: Uint8Array } };
            expect(outcome.kind).toBe('executed');
            const answered = JSON.parse(Buffer.from(outcome.response.body).toString());
            // The route's handler ran with the resumed operation and the saved body, parsed.
            expect(answered).toMatchObject({ n: 1, key, received: body });
            const late = await send(app, 'POST', '/orders', { key, body });
            expect(late.status).toBe(201);
            expect(late.headers.get('idempotency-replayed')).toBe('true');
            expect(late.json()).toEqual(answered);
            expect(app.calls['POST /orders']).toBe(1);
          }));

        it('no key on a required route: 400 before the handler runs', () =>
          withApp({ required: true }, async (app) => {
            expectError(
              await send(app, 'POST', '/orders', { body: { a: 1 } }),
              400,
              'idempotency_key_missing',
            );
            expect(app.calls['POST /orders']).toBeUndefined();
          }));

        it.each(MALFORMED_KEYS)('malformed key, %s: 400 and the handler does not run', (_name, lines) =>
          withApp({}, async (app) => {
            const reply = await rawPost(app, '/orders', lines);
            expect(reply.status).toBe(400);
            // node:http refuses control characters itself, before any adapter sees the request.
            if (reply.text.includes('idempotency_key'))
              expect(reply.text).toContain('idempotency_key_invalid');
            expect(app.calls['POST /orders']).toBeUndefined();
          }),
        );

        it.each([
          ['two bare keys', ['a', 'b']],
          ['one key twice', ['a', 'a']],
          ['two quoted keys', ['"a"', '"b"']],
        ])('the key header twice (%s): 400 saying it appears more than once', (_name, keys) =>
          withApp({}, async (app) => {
            const reply = await rawPost(
              app,
              '/orders',
              keys.map((key) => Buffer.from(`Idempotency-Key: ${key}`)),
            );
            expect(reply.status).toBe(400);
            expect(reply.text).toContain('idempotency_key_invalid');
            expect(reply.text).toContain('appears more than once');
            expect(app.calls['POST /orders']).toBeUndefined();
          }),
        );

        it('headerName: the key is read from that header, and Idempotency-Key is then ignored', () =>
          withApp({ headerName: 'X-Request-Key', required: true }, async (app) => {
            const key = newKey();
            const headers = { 'x-request-key': key };
            const first = await send(app, 'POST', '/orders', { body: { a: 1 }, headers });
            const second = await send(app, 'POST', '/orders', { body: { a: 1 }, headers });
            expectReplayOf(second, first);
            expectError(
              await send(app, 'POST', '/orders', { key, body: { a: 1 } }),
              400,
              'idempotency_key_missing',
            );
            expect(app.calls['POST /orders']).toBe(1);
          }));

        it('echoKey: fresh answers, streamed ones, replays and errors to a keyed request carry its Idempotency-Key', () =>
          withApp({ echoKey: true }, async (app) => {
            const key = newKey();
            const fresh = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            const replay = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            expectReplayOf(replay, fresh);
            const conflict = await send(app, 'POST', '/orders', { key, body: { a: 2 } });
            expect(conflict.status).toBe(409);
            const streamKey = newKey();
            const streamed = await send(app, 'POST', '/stream?size=3000', { key: streamKey });
            const empty = await send(app, 'POST', '/empty', { key: `"${key}-e"` });
            for (const [reply, sent] of [
              [fresh, key],
              [replay, key],
              [conflict, key],
              [streamed, streamKey],
              [empty, `${key}-e`],
            ] as const) {
              expect(reply.headers.get('idempotency-key')).toBe(sent);
            }
            const keyless = await send(app, 'POST', '/orders', { body: { a: 1 } });
            expect(keyless.headers.get('idempotency-key')).toBeNull();
          }));

        it('echoKey with the ietf profile echoes the key as an sf-string; without echoKey nothing is echoed', async () => {
          const key = newKey();
          await withApp({ echoKey: true, profile: 'ietf' }, async (app) => {
            const fresh = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            const replay = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            expect([fresh.headers.get('idempotency-key'), replay.headers.get('idempotency-key')]).toEqual([
              `"${key}"`,
              `"${key}"`,
            ]);
          });
          await withApp({}, async (app) => {
            const other = newKey();
            const fresh = await send(app, 'POST', '/orders', { key: other, body: { a: 1 } });
            const replay = await send(app, 'POST', '/orders', { key: other, body: { a: 1 } });
            expect([fresh.headers.get('idempotency-key'), replay.headers.get('idempotency-key')]).toEqual([
              null,
              null,
            ]);
          });
        });

        it('a quoted sf-string key and the same bare key name one operation', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const first = await send(app, 'POST', '/orders', { key: `"${key}"`, body: { a: 1 } });
            const second = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            expect(first.json().key).toBe(key);
            expectReplayOf(second, first);
          }));

        it('replay: original status, stored headers and body bytes, plus Idempotency-Replayed', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const first = await send(app, 'POST', '/orders', { key, body: { item: 'book', qty: 2 } });
            expect(first.status).toBe(201);
            expect(first.json()).toMatchObject({ n: 1, key, tx: false, received: { item: 'book', qty: 2 } });
            // downstreamKey: stable per scope, key and purpose, and opaque (sha256, base64url).
            expect(first.json().charge).toMatch(/^[\w-]{43}$/);
            expect(first.headers.get('set-cookie')).toBe('sid=1');
            expect(first.headers.get('x-trace')).toBe('1');
            const replay = await send(app, 'POST', '/orders', { key, body: { qty: 2, item: 'book' } });
            expectReplayOf(replay, first);
            expect(replay.headers.get('x-trace')).toBeNull();
            expect(app.calls['POST /orders']).toBe(1);
          }));

        it.each(['/text', '/buffer', '/stream?size=3000'])('replay of %s is byte-identical', (path) =>
          withApp({}, async (app) => {
            const key = newKey();
            const first = await send(app, 'POST', path, { key, body: {} });
            expect(first.status).toBe(200);
            if (path !== '/text') expect(first.body.equals(pattern(1, 3000))).toBe(true);
            const replay = await send(app, 'POST', path, { key, body: {} });
            expectReplayOf(replay, first);
            expect(Object.values(app.calls)).toEqual([1]);
          }),
        );

        it('JSON with no canonical form (1e400, a lone surrogate, 200,000 nested arrays): the handler answers, and a retry replays', () =>
          withApp({}, async (app) => {
            const bodies = ['{"n":1e400}', '{"s":"\\ud800"}', `${'['.repeat(200_000)}${']'.repeat(200_000)}`];
            for (const [i, body] of bodies.entries()) {
              const key = newKey();
              const first = await send(app, 'POST', '/text', { key, body });
              expect(first.status, body.slice(0, 20)).toBe(200);
              expect(first.body.toString()).toBe(`made ${i + 1}`);
              expectReplayOf(await send(app, 'POST', '/text', { key, body }), first);
            }
            expect(app.calls['POST /text']).toBe(bodies.length);
          }));

        // JSON.parse reads 1e400 as Infinity, which JSON.stringify writes as null: behind a body
        // parser these bodies once shared a fingerprint, and the retry got the other's replay.
        it('{"n":1e400}, {"n":-1e400} and {"n":null} under one key: each replays itself, the others get 409', () =>
          withApp({}, async (app) => {
            const bodies = ['{"n":1e400}', '{"n":-1e400}', '{"n":null}'];
            for (const body of bodies) {
              const key = newKey();
              const original = await send(app, 'POST', '/orders', { key, body });
              expect(original.status, body).toBe(201);
              for (const retry of bodies) {
                const reply = await send(app, 'POST', '/orders', { key, body: retry });
                if (retry === body) expectReplayOf(reply, original);
                else expectError(reply, 409, 'key_conflict');
              }
            }
            expect(app.calls['POST /orders']).toBe(bodies.length);
          }));

        it('a body stored gzip-encoded: replayed so to a retry that accepts gzip, decoded for one that does not', () =>
          withApp({}, replaysGzipPerAcceptEncoding));

        it('a form body: the same form replays, another form under the same key gets 409', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const headers = { 'content-type': 'application/x-www-form-urlencoded' };
            const first = await send(app, 'POST', '/form', { key, body: 'isbn=1&member=2', headers });
            expect(first.status).toBe(201);
            expect(first.json()).toMatchObject({ n: 1, form: { isbn: '1', member: '2' } });
            if (adapter.bodyParsers === 'before') expect(first.json().parsedByFramework).toBe(true);
            expectReplayOf(
              await send(app, 'POST', '/form', { key, body: 'isbn=1&member=2', headers }),
              first,
            );
            expectError(
              await send(app, 'POST', '/form', { key, body: 'isbn=9&member=2', headers }),
              409,
              'key_conflict',
            );
            expect(app.calls['POST /form']).toBe(1);
          }));

        it('a form with its fields in another order replays; the same fields as JSON or text/plain get 409', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const form = { 'content-type': 'application/x-www-form-urlencoded' };
            const first = await send(app, 'POST', '/form', { key, body: 'item=book&qty=2', headers: form });
            expect(first.status).toBe(201);
            expectReplayOf(
              await send(app, 'POST', '/form', { key, body: 'qty=2&item=book', headers: form }),
              first,
            );
            // The bytes a parsed form is written as, sent as another media type.
            for (const type of ['text/plain', 'application/json']) {
              const reply = await send(app, 'POST', '/form', {
                key,
                body: '{"item":"book","qty":"2"}',
                headers: { 'content-type': type },
              });
              expectError(reply, 409, 'key_conflict');
            }
            expect(app.calls['POST /form']).toBe(1);
          }));

        it('a body no parser reads (text/plain): the same bytes replay, other bytes under the same key get 409', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const headers = { 'content-type': 'text/plain' };
            const first = await send(app, 'POST', '/text', { key, body: 'hello', headers });
            expect(first.status).toBe(200);
            expectReplayOf(await send(app, 'POST', '/text', { key, body: 'hello', headers }), first);
            expectError(
              await send(app, 'POST', '/text', { key, body: 'world', headers }),
              409,
              'key_conflict',
            );
            expect(app.calls['POST /text']).toBe(1);
          }));

        if (adapter.bodyParsers === 'after')
          it('a parser mounted after the middleware skips the body it read, and the handler gets a Buffer', () =>
            withApp({}, async (app) => {
              const key = newKey();
              const first = await send(app, 'POST', '/parser-after', { key, body: { a: 1 } });
              expect(first.status).toBe(201);
              expect(first.json()).toEqual({ n: 1, received: 'buffer:{"a":1}' });
              expectReplayOf(await send(app, 'POST', '/parser-after', { key, body: { a: 1 } }), first);
              expect(app.calls['POST /parser-after']).toBe(1);
            }));

        it('a refused request (400, 413, 415, 422, 429) is not saved: the corrected one runs under the same key', () =>
          withApp({}, async (app) => {
            for (const status of [400, 413, 415, 422, 429]) {
              const key = newKey();
              const refused = await send(app, 'POST', '/orders', { key, body: { status } });
              expect(refused.status).toBe(status);
              expect(refused.json()).toMatchObject({ error: 'refused' });
              const corrected = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
              expect(corrected.status, String(status)).toBe(201);
              expect(corrected.headers.get('idempotency-replayed')).toBeNull();
              expectReplayOf(await send(app, 'POST', '/orders', { key, body: { a: 1 } }), corrected);
            }
            // Any other answer below 500 is the operation's outcome: kept, so another body conflicts.
            const key = newKey();
            const forbidden = await send(app, 'POST', '/orders', { key, body: { status: 403 } });
            expect(forbidden.status).toBe(403);
            expectReplayOf(await send(app, 'POST', '/orders', { key, body: { status: 403 } }), forbidden);
            expectError(await send(app, 'POST', '/orders', { key, body: { a: 1 } }), 409, 'key_conflict');
            expect(app.calls['POST /orders']).toBe(11);
          }));

        it('an absolute-form target (POST http://host/orders) and its origin-form retry name one operation', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const first = await rawPost(app, `${app.url}/orders`, [Buffer.from(`Idempotency-Key: ${key}`)]);
            expect(first.status).toBe(201);
            const retry = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            expect(retry.status).toBe(201);
            expect(retry.headers.get('idempotency-replayed')).toBe('true');
            expect(app.calls['POST /orders']).toBe(1);
          }));

        it('PATCH is guarded like POST', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const first = await send(app, 'PATCH', '/orders', { key, body: { a: 1 } });
            expectReplayOf(await send(app, 'PATCH', '/orders', { key, body: { a: 1 } }), first);
            expect(app.calls['PATCH /orders']).toBe(1);
          }));

        it('same key, different body or path: 409 and the handler does not run', () =>
          withApp({}, async (app) => {
            const key = newKey();
            await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            const otherBody = await send(app, 'POST', '/orders', { key, body: { a: 2 } });
            expectError(otherBody, 409, 'key_conflict');
            expect(otherBody.json().key).toBe(key);
            expectError(await send(app, 'POST', '/text', { key, body: { a: 1 } }), 409, 'key_conflict');
            expectError(await send(app, 'POST', '/orders?x=1', { key, body: { a: 1 } }), 409, 'key_conflict');
            expect(app.calls['POST /orders']).toBe(1);
            expect(app.calls['POST /text']).toBeUndefined();
          }));

        it("profile 'ietf': a mismatch is 422 problem+json linking the draft's error section", () =>
          withApp({ profile: 'ietf' }, async (app) => {
            const key = newKey();
            await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            const reply = await send(app, 'POST', '/orders', { key, body: { a: 2 } });
            expect(reply.status).toBe(422);
            expect(reply.headers.get('content-type')).toBe('application/problem+json');
            expect(reply.headers.get('link')).toBe(`<${IETF_DRAFT_ERRORS_URL}>; rel="describedby"`);
            expect(reply.json()).toMatchObject({
              type: IETF_DRAFT_ERRORS_URL,
              title: 'Idempotency-Key is already used',
              status: 422,
              code: 'key_conflict',
            });
          }));

        it('docsUrl: errors carry a describedby Link to it', () =>
          withApp({ required: true, docsUrl: 'https://developer.example.com/idempotency' }, async (app) => {
            const reply = await send(app, 'POST', '/orders', { body: { a: 1 } });
            expectError(reply, 400, 'idempotency_key_missing');
            expect(reply.headers.get('link')).toBe(
              '<https://developer.example.com/idempotency>; rel="describedby"',
            );
          }));

        it('onError renders engine errors', () =>
          withApp(
            {
              required: true,
              onError: (error) => ({
                status: error.status,
                headers: { 'content-type': 'text/plain' },
                body: Buffer.from(`custom ${error.code}`),
              }),
            },
            async (app) => {
              const reply = await send(app, 'POST', '/orders', { body: {} });
              expect(reply.status).toBe(400);
              expect(reply.headers.get('content-type')).toMatch(/^text\/plain/);
              expect(reply.body.toString()).toBe('custom idempotency_key_missing');
            },
          ));

        it('a duplicate of an in-progress request waits, then gets the replay', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const first = send(app, 'POST', '/slow?ms=400', { key, body: { a: 1 } });
            await until(() => app.calls['POST /slow'] === 1, 'the first request to reach the handler');
            const second = await send(app, 'POST', '/slow?ms=400', { key, body: { a: 1 } });
            expectReplayOf(second, await first);
            expect(app.calls['POST /slow']).toBe(1);
          }));

        it("concurrency 'reject': a duplicate in progress is 409 with Retry-After", () =>
          withApp({ concurrency: 'reject' }, async (app) => {
            const key = newKey();
            const first = send(app, 'POST', '/slow?ms=500', { key, body: { a: 1 } });
            await until(() => app.calls['POST /slow'] === 1, 'the first request to reach the handler');
            const second = await send(app, 'POST', '/slow?ms=500', { key, body: { a: 1 } });
            expectError(second, 409, 'request_in_progress');
            expect(Number(second.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
            expect((await first).status).toBe(201);
            expectReplayOf(await send(app, 'POST', '/slow?ms=500', { key, body: { a: 1 } }), await first);
            expect(app.calls['POST /slow']).toBe(1);
          }));

        it("a handler whose lease was lost: its client gets the answer saved meanwhile, none of the handler's", async () => {
          const events: IdempotencyEvent[] = [];
          // Renewals fail, as with the store unreachable for a whole lease; claims are recorded so
          // the test can take the key over with the engine's own claim.
          const claims: ClaimInput[] = [];
          const losing = new Proxy(store, {
            get: (target, property, receiver) => {
              if (property === 'renew') return async () => false;
              if (property === 'claim') {
                return (input: ClaimInput) => {
                  claims.push(input);
                  return target.claim(input);
                };
              }
              return Reflect.get(target, property, receiver);
            },
          });
          await withApp(
            { store: losing, lease: 200, onEvent: (event: IdempotencyEvent) => events.push(event) },
            async (app) => {
              const key = newKey();
              const late = send(app, 'POST', '/slow?ms=800', { key, body: { a: 1 } });
              await until(() => app.calls['POST /slow'] === 1, 'the first request to reach the handler');
              await sleep(400);
              const taken = await store.claim({ ...claims[0]!, leaseMs: 60_000 });
              if (taken.outcome !== 'acquired')
                throw new Error(`expected to take over, got ${taken.outcome}`);
              const winner = {
                status: 201,
                headers: { 'content-type': 'application/json', location: '/orders/winner' },
                body: Buffer.from('{"winner":true}'),
              };
              expect(await store.complete(claims[0]!.scope, key, taken.token, winner)).toBe(true);
              const reply = await late;
              expect(reply.status).toBe(201);
              expect(reply.json()).toEqual({ winner: true });
              expect(reply.headers.get('idempotency-replayed')).toBe('true');
              expect(reply.headers.get('location')).toBe('/orders/winner');
              for (const name of ['set-cookie', 'x-trace', 'etag'])
                expect(reply.headers.get(name), name).toBeNull();
              expect(events.filter((e) => e.type === 'fenced')).toEqual([
                { type: 'fenced', key, scope: claims[0]!.scope, step: 'complete' },
              ]);
              expect(events.filter((e) => e.type === 'lease_lost')).toHaveLength(1);
            },
          );
        });

        for (const path of adapter.throwPaths) {
          it(`handler failing (${path}): the key is released and the retry runs`, () =>
            withApp({}, async (app) => {
              const key = newKey();
              const failed = await send(app, 'POST', path, { key, body: { a: 1 } });
              expect(failed.status).toBeGreaterThanOrEqual(500);
              expect(failed.headers.get('idempotency-replayed')).toBeNull();
              const retry = await send(app, 'POST', path, { key, body: { a: 1 } });
              expect(retry.status).toBe(201);
              expectReplayOf(await send(app, 'POST', path, { key, body: { a: 1 } }), retry);
              expect(app.calls[`POST ${path}`]).toBe(2);
            }));
        }

        it('a 5xx response is not stored: the key is released and the retry runs', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const failed = await send(app, 'POST', '/fail', { key, body: { a: 1 } });
            expect(failed.status).toBe(500);
            expect(failed.json()).toEqual({ error: 'boom' });
            const retry = await send(app, 'POST', '/fail', { key, body: { a: 1 } });
            expect(retry.status).toBe(201);
            expect(retry.headers.get('idempotency-replayed')).toBeNull();
            expect(app.calls['POST /fail']).toBe(2);
          }));

        it('after the retention window the key names a new operation', () =>
          withApp({ ttl: 300, lease: 300 }, async (app) => {
            const key = newKey();
            const first = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            await sleep(800);
            const later = await send(app, 'POST', '/orders', { key, body: { a: 2 } });
            expect(later.status).toBe(201);
            expect(later.headers.get('idempotency-replayed')).toBeNull();
            expect([first.json().n, later.json().n]).toEqual([1, 2]);
          }));

        it('a request body over maxBodyBytes: 413 and the handler does not run; the server stays up', () =>
          withApp({ maxBodyBytes: 1024 }, async (app) => {
            const large = await send(app, 'POST', '/orders', {
              key: newKey(),
              body: { pad: 'x'.repeat(5000) },
            });
            expectError(large, 413, 'body_too_large');
            expect(app.calls['POST /orders']).toBeUndefined();
            expect((await send(app, 'POST', '/orders', { key: newKey(), body: { a: 1 } })).status).toBe(201);
          }));

        // Store-independent, so once per adapter: 30 uploads of 5 MB are not free on a shared machine.
        if (factory === stores[0])
          it('30 fetch uploads of 5 MB over maxBodyBytes: all 30 get their 413, none a reset; the server stays up', () =>
            withApp({}, async (app) => {
              expect(await uploadFromAnotherThread(app, '/orders', 30, 5_000_000)).toEqual(
                Array(30).fill(413),
              );
              expect(app.calls['POST /orders']).toBeUndefined();
              expect((await send(app, 'POST', '/orders', { key: newKey(), body: { a: 1 } })).status).toBe(
                201,
              );
            }));

        // Store-independent too: a refusal answered before the body was read (the key is checked
        // first; a declared length past the limit needs no reading) reaches a client still uploading.
        if (factory === stores[0]) {
          it('the key header twice on a 900 KiB upload still being sent: its 400, never a reset', () =>
            withApp({}, async (app) => {
              const twice: RawRequest['headers'] = [
                ['Idempotency-Key', 'a'],
                ['Idempotency-Key', 'b'],
              ];
              expect(await refusedLargeUpload(app, twice)).toEqual([400, 400, 400]);
            }));

          it.each([
            ['declared by its Content-Length', { kind: 'length' }],
            ['chunked', { kind: 'chunked', sizes: [16 * 1024] }],
          ] as const)(
            'a 900 KiB upload over maxBodyBytes, %s, still being sent: its 413, never a reset',
            (_, framing) =>
              withApp({ maxBodyBytes: 64 * 1024 }, async (app) => {
                expect(await refusedLargeUpload(app, [['Idempotency-Key', newKey()]], framing)).toEqual([
                  413, 413, 413,
                ]);
                expect(app.calls['POST /orders']).toBeUndefined();
              }),
          );
        }

        it('a 204 carries no Content-Length, first answer or replay (RFC 9110 §8.6)', () =>
          withApp({ replayHeaders: ['x-trace'] }, async (app) => {
            const key = newKey();
            const first = await send(app, 'POST', '/empty', { key, body: {} });
            const replay = await send(app, 'POST', '/empty', { key, body: {} });
            expect([first.status, replay.status]).toEqual([204, 204]);
            expect(first.headers.get('content-length')).toBeNull();
            expect(replay.headers.get('content-length')).toBeNull();
            expect(replay.headers.get('idempotency-replayed')).toBe('true');
            expect(replay.headers.get('x-trace')).toBe('1');
            expect(app.calls['POST /empty']).toBe(1);
          }));

        it("a `scope` that throws goes down the framework's error path: an answer, never a reset", () =>
          withApp(
            {
              scope: () => {
                throw new Error('no tenant');
              },
            },
            async (app) => {
              const reply = await send(app, 'POST', '/orders', { key: newKey(), body: { a: 1 } });
              expect(reply.status).toBe(500);
              expect(app.calls['POST /orders']).toBeUndefined();
            },
          ));

        it.each(['/stream', '/buffer'])(
          'a %s response over maxResponseBytes is sent whole, not stored, and the key released',
          (path) =>
            withApp({ maxResponseBytes: 4096 }, async (app) => {
              const key = newKey();
              const first = await send(app, 'POST', `${path}?size=20000`, { key, body: {} });
              expect(first.status).toBe(200);
              expect(first.body.equals(pattern(1, 20000))).toBe(true);
              const second = await send(app, 'POST', `${path}?size=20000`, { key, body: {} });
              expect(second.headers.get('idempotency-replayed')).toBeNull();
              expect(second.body.equals(pattern(2, 20000))).toBe(true);
            }),
        );

        // Found by the adapter fuzz (test/fuzz): Nest's StreamableFile, like any body piped into
        // the response, stops when the client leaves, so the response never ended.
        it('a client that hangs up during a response streamed past maxResponseBytes: its key is released', () =>
          withApp({ maxResponseBytes: 16 * 1024, lease: '1h' }, async (app) => {
            const key = newKey();
            const outcome = await exchange(Number(new URL(app.url).port), {
              method: 'POST',
              target: '/stream?size=21398',
              headers: [['Idempotency-Key', key]],
              body: Buffer.alloc(0),
              framing: { kind: 'length' },
              cuts: [],
              hangUp: { at: 'answer' },
            });
            expect(outcome.kind).toBe('hung-up');
            await settled(store, key);
            const retry = await send(app, 'POST', '/stream?size=21398', { key });
            expect(retry.body.equals(pattern(2, 21398))).toBe(true);
          }));

        it('30 concurrent duplicates: one execution, 30 identical answers', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const replies = await Promise.all(
              Array.from({ length: 30 }, () => send(app, 'POST', '/slow?ms=300', { key, body: { a: 1 } })),
            );
            expect(replies.map((r) => r.status)).toEqual(Array(30).fill(201));
            for (const reply of replies) expect(reply.body.equals(replies[0]!.body)).toBe(true);
            expect(replies.filter((r) => r.headers.get('idempotency-replayed') === 'true')).toHaveLength(29);
            expect(app.calls['POST /slow']).toBe(1);
          }));

        it('scope isolation: the same key from two bearer tokens names two operations', () =>
          withApp({ scopeByAuthorization: true }, async (app) => {
            const key = newKey();
            const alice = { authorization: 'Bearer alice' };
            const bob = { authorization: 'Bearer bob' };
            const a1 = await send(app, 'POST', '/orders', { key, body: { a: 1 }, headers: alice });
            const b1 = await send(app, 'POST', '/orders', { key, body: { a: 1 }, headers: bob });
            expect(b1.headers.get('idempotency-replayed')).toBeNull();
            expect([a1.json().n, b1.json().n]).toEqual([1, 2]);
            expect(a1.json().charge).not.toBe(b1.json().charge);
            expectReplayOf(await send(app, 'POST', '/orders', { key, body: { a: 1 }, headers: alice }), a1);
            expectReplayOf(await send(app, 'POST', '/orders', { key, body: { a: 1 }, headers: bob }), b1);
            // A different body under Bob's scope is Bob's conflict, not Alice's.
            expectError(
              await send(app, 'POST', '/orders', { key, body: { a: 9 }, headers: bob }),
              409,
              'key_conflict',
            );
            expect(app.calls['POST /orders']).toBe(2);
          }));

        it('without a scope option, each Authorization value is its own scope', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const callers: Record<string, string>[] = [
              { authorization: 'Basic YWxpY2U6eA==' },
              { authorization: 'Basic Ym9iOng=' },
              {},
            ];
            const first: Reply[] = [];
            for (const headers of callers) {
              first.push(await send(app, 'POST', '/orders', { key, body: { a: 1 }, headers }));
            }
            expect(first.map((reply) => reply.json().n)).toEqual([1, 2, 3]);
            for (const [i, headers] of callers.entries()) {
              expectReplayOf(await send(app, 'POST', '/orders', { key, body: { a: 1 }, headers }), first[i]!);
            }
            expect(app.calls['POST /orders']).toBe(3);
          }));

        it.each(['GET', 'HEAD', 'PUT', 'DELETE'])('%s passes through untouched, key or not', (method) =>
          withApp({ required: true }, async (app) => {
            const key = newKey();
            for (const n of [1, 2]) {
              const reply = await send(app, method, '/orders', { key });
              expect(reply.status).toBe(200);
              expect(reply.headers.get('idempotency-replayed')).toBeNull();
              if (method !== 'HEAD') expect(reply.json()).toEqual({ n, key: null });
            }
            expect((await send(app, method, '/orders')).status).toBe(200);
            expect(app.calls[`${method} /orders`]).toBe(3);
          }),
        );

        it('peer failure: replays keep Location (and ETag, Content-Type)', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const first = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            const replay = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            expect(first.headers.get('location')).toBe('/orders/1');
            expect(replay.headers.get('location')).toBe('/orders/1');
            expect(replay.headers.get('etag')).toBe('"1"');
          }));

        it('set-cookie is never replayed', () =>
          withApp({ replayHeaders: ['set-cookie', 'x-trace'] }, async (app) => {
            const key = newKey();
            const first = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            const replay = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
            expect(first.headers.get('set-cookie')).toBe('sid=1');
            expect(replay.headers.get('set-cookie')).toBeNull();
            expect(replay.headers.get('x-trace')).toBe('1');
          }));

        it('peer failure: a handler error never leaves the key stuck in progress', () =>
          withApp({ concurrency: 'reject', lease: '1h', ttl: '1d' }, async (app) => {
            const path = adapter.throwPaths[0]!;
            const key = newKey();
            expect((await send(app, 'POST', path, { key, body: { a: 1 } })).status).toBeGreaterThanOrEqual(
              500,
            );
            // With 'reject', a stuck key would answer 409 at once; the freed key runs the retry.
            expect((await send(app, 'POST', path, { key, body: { a: 1 } })).status).toBe(201);
          }));

        it('peer failure: a "replayed" flag sent by the client is ignored, and cannot hang a request', () =>
          withApp({}, async (app) => {
            const key = newKey();
            const flags = {
              'idempotency-replayed': 'true',
              'x-idempotency-replayed': 'true',
              'x-replay': 'true',
              'idempotent-replay': 'true',
            };
            const first = await send(app, 'POST', '/orders', { key, body: { a: 1 }, headers: flags });
            expect(first.status).toBe(201);
            expect(first.headers.get('idempotency-replayed')).toBeNull();
            expect(app.calls['POST /orders']).toBe(1);
            const noKey = await send(app, 'POST', '/orders', { body: { a: 1 }, headers: flags });
            expect(noKey.json().n).toBe(2);
            expectReplayOf(await send(app, 'POST', '/orders', { key, body: { a: 1 } }), first);
          }));

        it('peer failure: the handler is never called after a replay is sent', () =>
          withApp({}, async (app) => {
            const key = newKey();
            for (const path of ['/orders', '/stream?size=2000', '/text']) {
              await send(app, 'POST', path, { key: `${key}${path}`, body: {} });
              const replay = await send(app, 'POST', path, { key: `${key}${path}`, body: {} });
              expect(replay.headers.get('idempotency-replayed')).toBe('true');
            }
            await sleep(200);
            expect(app.calls).toEqual({ 'POST /orders': 1, 'POST /stream': 1, 'POST /text': 1 });
          }));

        it('a store that fails: 503 JSON with Retry-After, and the handler does not run', async () => {
          const app = await adapter.start({ store: brokenStore('failing') });
          try {
            const reply = await send(app, 'POST', '/orders', { key: newKey(), body: { a: 1 } });
            expectError(reply, 503, 'store_unavailable');
            expect(reply.headers.get('retry-after')).toBe('1');
            expect(app.calls['POST /orders']).toBeUndefined();
          } finally {
            await app.close();
          }
        });

        it('a store that never answers: 503 after storeTimeout, never a hang', async () => {
          const app = await adapter.start({ store: brokenStore('hanging'), storeTimeout: 200 });
          try {
            expectError(
              await send(app, 'POST', '/orders', { key: newKey(), body: {} }),
              503,
              'store_unavailable',
            );
            expect(app.calls['POST /orders']).toBeUndefined();
          } finally {
            await app.close();
          }
        });

        // Stores without transactions have no atomic mode to test (the engine refuses it at construction).
        if (factory.atomic)
          describe('atomic mode', () => {
            const atomic = (fn: (app: RunningApp) => Promise<void>) => () => {
              expect(isAtomicStore(store)).toBe(true);
              return withApp({ mode: 'atomic' }, fn);
            };

            it(
              'a body stored gzip-encoded is decoded for a retry that does not accept gzip',
              atomic(replaysGzipPerAcceptEncoding),
            );

            it(
              'the handler gets ctx.tx; the response commits with the record and replays',
              atomic(async (app) => {
                const key = newKey();
                const first = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
                expect(first.status).toBe(201);
                expect(first.json()).toMatchObject({ n: 1, key, tx: true });
                expectReplayOf(await send(app, 'POST', '/orders', { key, body: { a: 1 } }), first);
              }),
            );

            it(
              'a refused request (422) is rolled back: the corrected one runs under the same key',
              atomic(async (app) => {
                const key = newKey();
                expect((await send(app, 'POST', '/orders', { key, body: { status: 422 } })).status).toBe(422);
                const corrected = await send(app, 'POST', '/orders', { key, body: { a: 1 } });
                expect(corrected.status).toBe(201);
                expectReplayOf(await send(app, 'POST', '/orders', { key, body: { a: 1 } }), corrected);
              }),
            );

            it(
              'a handler error rolls back and the retry runs',
              atomic(async (app) => {
                const path = adapter.throwPaths[0]!;
                const key = newKey();
                expect((await send(app, 'POST', path, { key, body: {} })).status).toBeGreaterThanOrEqual(500);
                expect((await send(app, 'POST', path, { key, body: {} })).status).toBe(201);
              }),
            );

            it('a response over maxResponseBytes: 500 response_too_large, none of the handler headers leak', () =>
              withApp({ mode: 'atomic', maxResponseBytes: 4096 }, async (app) => {
                const key = newKey();
                for (const path of ['/stream?size=20000', '/buffer?size=20000']) {
                  const reply = await send(app, 'POST', path, { key: `${key}${path}`, body: {} });
                  expectError(reply, 500, 'response_too_large');
                }
                const order = await send(app, 'POST', '/orders', { key, body: { pad: 'x'.repeat(5000) } });
                expectError(order, 500, 'response_too_large');
                expect(order.headers.get('location')).toBeNull();
                expect(order.headers.get('set-cookie')).toBeNull();
              }));

            it(
              '30 concurrent duplicates: one execution',
              atomic(async (app) => {
                const key = newKey();
                const replies = await Promise.all(
                  Array.from({ length: 30 }, () => send(app, 'POST', '/slow?ms=200', { key, body: {} })),
                );
                expect(replies.map((r) => r.status)).toEqual(Array(30).fill(201));
                for (const reply of replies) expect(reply.body.equals(replies[0]!.body)).toBe(true);
                expect(app.calls['POST /slow']).toBe(1);
              }),
            );
          });
      },
    );
  }
}

/**
 * A first attempt at POST `path` that saved a step and died (its process, not the app's, claimed
 * the key): resolves with the abandoned record a completer finds, once its ended lease passed.
 */
export async function abandon(
  store: IdempotencyStore,
  key: string,
  path: string,
  body: unknown,
): Promise<AbandonedRecord> {
  await createIdempotency({ store, lease: 1 })
    .handle(
      {
        method: 'POST',
        path,
        keyHeader: key,
        contentType: 'application/json',
        acceptEncoding: undefined,
        authorization: undefined,
        readBody: () => Buffer.from(JSON.stringify(body)),
        raw: undefined,
      },
      async (ctx) => {
        await ctx.step('charged', () => 'ch_1');
        throw new Error('the process died');
      },
    )
    .catch(() => undefined);
  for (let tries = 0; tries < 400; tries++) {
    const record = (await store.abandoned({ limit: 1000 })).find((found) => found.key === key);
    if (record !== undefined) return record;
    await sleep(5);
  }
  throw new Error(`no abandoned record of ${key}`);
}

/** A gzip-encoded response replays as stored to a retry that accepts gzip, decoded to one that does not. */
async function replaysGzipPerAcceptEncoding(app: RunningApp): Promise<void> {
  const key = newKey();
  // fetch asks for gzip and deflate, and decodes what it gets.
  const first = await send(app, 'POST', '/gzip', { key, body: {} });
  expect(first.headers.get('content-encoding')).toBe('gzip');
  expect(first.json()).toEqual({ n: 1 });
  const gzipped = await send(app, 'POST', '/gzip', { key, body: {} });
  expectReplayOf(gzipped, first);
  expect(gzipped.headers.get('content-encoding')).toBe('gzip');
  for (const accept of ['identity', 'br', 'gzip;q=0, deflate']) {
    const headers = { 'accept-encoding': accept };
    const plain = await send(app, 'POST', '/gzip', { key, body: {}, headers });
    expect(plain.headers.get('idempotency-replayed'), accept).toBe('true');
    expect(plain.headers.get('content-encoding'), accept).toBeNull();
    expect(plain.headers.get('content-length'), accept).toBe(String(plain.body.byteLength));
    expect(plain.headers.get('vary'), accept).toBe('Accept-Encoding');
    expect(plain.json()).toEqual({ n: 1 });
  }
  expect(app.calls['POST /gzip']).toBe(1);
}
