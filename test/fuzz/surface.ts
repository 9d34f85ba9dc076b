import { gunzipSync } from 'node:zlib';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { IdempotencyStore, KeyRecordSummary } from '../../src/core/contract/index.js';
import { memoryStore } from '../../src/stores/memory.js';
import type { AdapterUnderTest, AppOptions, RunningApp } from '../../src/testing/adapter-suite.js';
import { exchange, type RawOutcome, type RawReply, type RawRequest } from '../../src/testing/raw-http.js';

/**
 * The adapter fuzz: one set of arbitraries over the HTTP surface (keys, repeated and odd headers,
 * content types, bodies, how the bytes are cut into writes, clients that hang up) and three
 * properties, run against the conformance catalog app of every adapter (see adapter-suite.ts):
 *
 * 1. whatever arrives, the server answers it with anything but a 5xx (a 503 only with
 *    Retry-After), nothing is thrown unhandled, and the next plain request still answers;
 * 2. one request (a valid key, any body) delivered several times, in other pieces, some of the
 *    deliveries hung up halfway, one after another or all at once: every answer is the same;
 * 3. once the server is closed, no key the fuzzer sent is left in progress.
 *
 * Only catalog routes whose handler never answers a 5xx itself are fuzzed: `/fail` and the throw
 * paths fail by design, as does any path the node:http and fetch catalogs do not know (on its
 * first call); `/form` parses multipart with the framework's parser; and a JSON body with a
 * `status` member asks `/orders` for that status, so no body carries one. A 5xx the app also
 * answers without a key (a body parser mounted in front of the guard) is the framework's, not
 * the guard's. A failure prints fast-check's seed and path, to replay it with `{ seed, path }`.
 */

/**
 * Runs per property, per adapter: the whole file stays within a minute on a loaded 2-core
 * machine. RETRYSAFE_FUZZ_RUNS=1000 fuzzes longer.
 */
const RUNS = Number(process.env.RETRYSAFE_FUZZ_RUNS ?? 40);

/** The app's options: small limits, so a few fuzzed bytes reach past them. */
const FUZZ_OPTIONS = {
  // A key left in progress stays visible for the whole run instead of being taken over.
  lease: '1h',
  maxBodyBytes: 64 * 1024,
  maxResponseBytes: 16 * 1024,
} satisfies Partial<AppOptions>;

// ---- arbitraries ----

const KEY_HEADER_NAMES = ['Idempotency-Key', 'idempotency-key', 'IDEMPOTENCY-KEY', 'iDeMpOtEnCy-kEy'];

const TOKEN = /^[A-Za-z0-9._~-]{1,40}$/;

/** Any byte but CR and LF, which would end the header line instead of being in it. */
const headerByte = fc
  .integer({ min: 0, max: 0xff })
  .filter((byte) => byte !== 0x0a && byte !== 0x0d)
  .map((byte) => String.fromCharCode(byte));

/** A key as a header value: valid ones, and each way one is malformed. */
const anyKey: fc.Arbitrary<string | Buffer> = fc.oneof(
  { weight: 4, arbitrary: fc.stringMatching(TOKEN) },
  fc.stringMatching(TOKEN).map((key) => `"${key}"`),
  fc.constantFrom('', ' ', '""', '"abc', '"a\\qb"', '"abc";p=1', 'a, b', '(a)', '*', 'k '.repeat(3)),
  // Around the 255-character bound, and past node's 16 KiB header limit.
  fc.integer({ min: 250, max: 20_000 }).map((length) => 'k'.repeat(length)),
  fc.string({ unit: 'grapheme', minLength: 1, maxLength: 12 }).map((key) => Buffer.from(key, 'utf8')),
  fc.string({ unit: headerByte, minLength: 1, maxLength: 12 }).map((key) => Buffer.from(key, 'latin1')),
);

/** No key, one, or the header repeated (with the same key or others). */
const keyHeaders = fc.oneof(
  fc.constant([]),
  fc.tuple(fc.constantFrom(...KEY_HEADER_NAMES), anyKey).map((header) => [header]),
  fc.array(fc.tuple(fc.constantFrom(...KEY_HEADER_NAMES), anyKey), { minLength: 2, maxLength: 3 }),
);

const CONTENT_TYPES = [
  'application/json',
  'application/json; charset=utf-8',
  'Application/JSON;charset="UTF-8"',
  'application/json; charset=latin1',
  'application/json; charset=utf-16',
  'application/vnd.api+json',
  'application/json, text/plain',
  'text/plain',
  'text/plain; charset=iso-8859-1',
  'application/x-www-form-urlencoded',
  'multipart/form-data; boundary=fuzz',
  'multipart/form-data',
  'application/octet-stream',
  '',
  ';;;',
  'json',
];

/** None, one, or two Content-Type headers, names in any casing. */
const contentTypes: fc.Arbitrary<Header[]> = fc.array(
  fc.tuple(
    fc.constantFrom('Content-Type', 'content-type', 'CONTENT-TYPE'),
    fc.constantFrom(...CONTENT_TYPES),
  ),
  { maxLength: 2 },
);

const ODD_HEADERS: ReadonlyArray<readonly [string, string]> = [
  ['Idempotency-Replayed', 'true'],
  ['Accept-Encoding', 'gzip'],
  ['Accept-Encoding', 'br;q=1, gzip;q=0'],
  ['Accept-Encoding', 'identity'],
  ['Accept-Encoding', '*;q=0'],
  ['Accept-Encoding', 'gzip;q=x, ;;'],
  // A body that says it is compressed and is not.
  ['Content-Encoding', 'gzip'],
  ['Content-Encoding', 'identity'],
  ['Authorization', 'Bearer fuzz'],
  ['Authorization', ''],
  ['Expect', '100-continue'],
  ['X-Long', 'v'.repeat(8_000)],
  ['X-Empty', ''],
  ['Cookie', 'sid=1; sid=2'],
  ['Connection', 'keep-alive'],
  ['X-Forwarded-For', '10.0.0.1, 10.0.0.2'],
];

/** Repeats allowed: two Authorization headers are as odd as one is ordinary. */
const oddHeaders: fc.Arbitrary<Header[]> = fc.array(fc.constantFrom(...ODD_HEADERS), { maxLength: 4 });

/** A JSON body with a `status` member is a refusal with that status in the catalog (see above). */
function asksForStatus(body: Buffer): boolean {
  try {
    const value: unknown = JSON.parse(body.toString());
    return typeof value === 'object' && value !== null && 'status' in value;
  } catch {
    return false;
  }
}

/**
 * Nesting past MAX_CANONICAL_DEPTH (500) but not so deep that the catalog's own JSON.stringify of
 * the echoed body runs out of stack (near 4,000 levels): the handler would answer that 500.
 */
const MAX_NESTING = 2_000;

/** Bodies of every kind, nested up to `nesting` levels; with `huge`, some past `maxBodyBytes`. */
function bodies(huge: boolean, nesting: number): fc.Arbitrary<Buffer> {
  const utf8 = (text: string) => Buffer.from(text, 'utf8');
  const kinds: fc.Arbitrary<Buffer>[] = [
    fc.constant(Buffer.alloc(0)),
    fc.json({ maxDepth: 3 }).map(utf8),
    // Mostly not JSON, and sometimes JSON cut short.
    fc.string({ maxLength: 60 }).map(utf8),
    fc.json({ maxDepth: 2 }).map((json) => utf8(json.slice(0, -1))),
    fc
      .tuple(fc.integer({ min: 1, max: nesting }), fc.constantFrom('[', '{"a":'), fc.boolean())
      .map(([depth, open, closed]) =>
        utf8(
          open.repeat(depth) +
            (open === '[' ? '' : '1') +
            (closed ? (open === '[' ? ']' : '}').repeat(depth) : ''),
        ),
      ),
    fc.uint8Array({ maxLength: 512 }).map((bytes) => Buffer.from(bytes)),
    fc
      .dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 8 }), { maxKeys: 4 })
      .map((fields) => utf8(new URLSearchParams(fields).toString())),
    fc
      .string({ maxLength: 40 })
      .map((value) =>
        utf8(`--fuzz\r\nContent-Disposition: form-data; name="a"\r\n\r\n${value}\r\n--fuzz--\r\n`),
      ),
  ];
  if (huge) {
    kinds.push(
      fc
        .integer({ min: 32 * 1024, max: 200 * 1024 })
        .map((size) => utf8(JSON.stringify({ pad: 'x'.repeat(size) }))),
    );
  }
  return fc
    .oneof(...kinds)
    .filter((body) => !asksForStatus(body))
    .map(printable);
}

/** `body`, shown in a counterexample by its length and first bytes rather than every byte. */
function printable(body: Buffer): Buffer {
  return Object.assign(body, {
    [fc.toStringMethod]: () =>
      `Buffer.from(${JSON.stringify(body.subarray(0, 64).toString('latin1'))}${body.length > 64 ? ` + ${body.length - 64} more bytes` : ''}, 'latin1')`,
  });
}

/** A header line: its name, and its value as text or bytes. */
type Header = RawRequest['headers'][number];

/** A request's method and target. */
type Target = readonly [method: string, target: string];

/**
 * The catalog routes whose handler answers without a 5xx and within `maxResponseBytes` (for a
 * body of at most a few hundred bytes, which `/orders` echoes), so their answers are saved.
 */
const SAVED_TARGETS: fc.Arbitrary<Target> = fc.oneof(
  fc.constantFrom<Target>(['POST', '/orders'], ['PATCH', '/orders']),
  fc.constantFrom(...['/text', '/empty', '/gzip'].map((path): Target => ['POST', path])),
  fc.integer({ min: 0, max: 8_000 }).map((size): Target => ['POST', `/buffer?size=${size}`]),
  fc.integer({ min: 0, max: 30 }).map((ms): Target => ['POST', `/slow?ms=${ms}`]),
);

/** `/stream` past `maxResponseBytes` is streamed through unsaved (its key released). */
const STREAMED_TARGETS: fc.Arbitrary<Target> = fc
  .integer({ min: 0, max: 40_000 })
  .map((size) => ['POST', `/stream?size=${size}`]);

const ODD_TARGETS: fc.Arbitrary<Target> = fc.constantFrom(
  ['GET', '/orders'],
  ['PUT', '/orders'],
  ['DELETE', '/orders'],
  ['OPTIONS', '/orders'],
  ['post', '/orders'],
  ['POST', '/orders?x=%zz&x=2'],
  ['POST', 'http://127.0.0.1/orders'],
);

/** `Content-Length`, or chunked in chunks of a few sizes. */
const framing: fc.Arbitrary<RawRequest['framing']> = fc.oneof(
  fc.constant<RawRequest['framing']>({ kind: 'length' }),
  fc
    .array(fc.integer({ min: 1, max: 4096 }), { minLength: 1, maxLength: 4 })
    .map((sizes): RawRequest['framing'] => ({ kind: 'chunked', sizes })),
);

/** How the bytes go out: where they are cut into writes, and whether the client hangs up. */
type Delivery = Pick<RawRequest, 'cuts' | 'hangUp'>;

const NEVER: RawRequest['hangUp'] = { at: 'never' };

const delivery = (hangUps: boolean): fc.Arbitrary<Delivery> =>
  fc.record({
    cuts: fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 6 }),
    hangUp: hangUps
      ? fc.oneof(
          { weight: 3, arbitrary: fc.constant(NEVER) },
          fc
            .double({ min: 0, max: 0.99, noNaN: true })
            .map((fraction): RawRequest['hangUp'] => ({ at: 'body', fraction })),
          fc.constant<RawRequest['hangUp']>({ at: 'sent' }),
          fc.constant<RawRequest['hangUp']>({ at: 'answer' }),
        )
      : fc.constant(NEVER),
  });

/** Anything a client may send. */
const anyRequest: fc.Arbitrary<RawRequest> = fc
  .record({
    target: fc.oneof({ weight: 4, arbitrary: SAVED_TARGETS }, STREAMED_TARGETS, ODD_TARGETS),
    keys: keyHeaders,
    types: contentTypes,
    odd: oddHeaders,
    body: bodies(true, MAX_NESTING),
    framing,
    delivery: delivery(true),
  })
  .map(({ target: [method, target], keys, types, odd, body, framing, delivery }) => ({
    method,
    target,
    headers: [...keys, ...types, ...odd],
    body,
    framing,
    ...delivery,
  }));

/**
 * One request, with a valid key but the same anything else, and its deliveries: at least two,
 * the last never hung up. `key` is the header value for a key made unique when it is sent.
 */
const resentRequest = fc.record({
  target: SAVED_TARGETS,
  keyName: fc.constantFrom(...KEY_HEADER_NAMES),
  quoted: fc.boolean(),
  stem: fc.stringMatching(/^[A-Za-z0-9._~-]{1,20}$/),
  types: contentTypes,
  odd: oddHeaders,
  body: bodies(false, 200),
  // One framing for every delivery: Fastify answers an empty chunked body without a
  // Content-Type 415, the same body with `Content-Length: 0` as a request without one.
  framing,
  deliveries: fc
    .tuple(fc.array(delivery(true), { minLength: 1, maxLength: 3 }), delivery(false))
    .map(([first, last]) => [...first, last]),
  together: fc.boolean(),
});

// ---- the properties ----

let serial = 0;

/** A request's line and headers, for a failure message (bodies and long values cut). */
function describeRequest(request: RawRequest): string {
  const headers = request.headers.map(
    ([name, value]) => `${name}: ${JSON.stringify(value.toString('latin1').slice(0, 60))}`,
  );
  return `${request.method} ${request.target} [${headers.join(', ')}] body ${request.body.length} bytes`;
}

/**
 * A reply's body as text, gzip undone: a replay to a client that did not say it accepts gzip is
 * sent decoded (see forAcceptEncoding), the same answer in another coding.
 */
function decoded(reply: RawReply): string {
  const gzipped = reply.headers['content-encoding']?.includes('gzip');
  return (gzipped ? gunzipSync(reply.body) : reply.body).toString('latin1');
}

/** Every record of `store` still in progress, across every page. */
async function inProgress(store: IdempotencyStore): Promise<KeyRecordSummary[]> {
  const stuck: KeyRecordSummary[] = [];
  let after: string | undefined;
  do {
    const page = await store.list({ after, limit: 1000 });
    stuck.push(...page.records.filter((record) => record.state === 'in_progress'));
    after = page.next ?? undefined;
  } while (after !== undefined);
  return stuck;
}

/** Runs the three properties against `adapter`'s catalog app, on a store of its own. */
export function describeAdapterFuzz(adapter: AdapterUnderTest): void {
  describe(`adapter fuzz: ${adapter.name}`, () => {
    const store = memoryStore();
    let app: RunningApp;
    let port: number;
    let closed = false;
    // Anything thrown that nobody handled, while this adapter's app serves: a crash of a real process.
    const unhandled: unknown[] = [];
    const record = (error: unknown) => unhandled.push(error);

    beforeAll(async () => {
      app = await adapter.start({ store, ...FUZZ_OPTIONS });
      port = Number(new URL(app.url).port);
      process.on('uncaughtException', record);
      process.on('unhandledRejection', record);
    });
    afterAll(async () => {
      process.off('uncaughtException', record);
      process.off('unhandledRejection', record);
      if (!closed) await app.close();
      await store.close();
    });

    // Each key sent, and the requests that carried it: what a key left in progress came from.
    const sentBy = new Map<string, string[]>();

    function send(request: RawRequest): Promise<RawOutcome> {
      for (const [name, value] of request.headers) {
        if (!KEY_HEADER_NAMES.includes(name)) continue;
        const key = value.toString('latin1').replace(/^"(.*)"$/, '$1');
        const delivery = `${JSON.stringify(request.framing)} cut at ${request.cuts.length}, hang-up ${JSON.stringify(request.hangUp)}`;
        sentBy.set(key, [...(sentBy.get(key) ?? []), `${describeRequest(request)}, ${delivery}`]);
      }
      return exchange(port, request);
    }

    async function stillAnswers(): Promise<void> {
      const outcome = await exchange(port, {
        method: 'POST',
        target: '/orders',
        headers: [
          ['Idempotency-Key', `alive-${++serial}`],
          ['Content-Type', 'application/json'],
        ],
        body: Buffer.from('{}'),
        framing: { kind: 'length' },
        cuts: [],
        hangUp: { at: 'never' },
      });
      expect(outcome.kind === 'reply' && outcome.reply.status, 'the next plain request').toBe(201);
      expect(unhandled, 'errors nobody handled').toEqual([]);
    }

    /**
     * Whether the app answers `request` with a 5xx without a key too, the guard letting it pass:
     * then the framework in front of the guard answered it (@koa/bodyparser's 500 for a body
     * declared gzip that is not), not the guard.
     */
    async function answersItself(request: RawRequest): Promise<boolean> {
      const headers = request.headers.filter(([name]) => !KEY_HEADER_NAMES.includes(name));
      const outcome = await exchange(port, { ...request, headers, cuts: [], hangUp: NEVER });
      return outcome.kind === 'reply' && outcome.reply.status >= 500;
    }

    it('answers whatever arrives, never with a 5xx but a 503 with Retry-After, and keeps answering', async () => {
      await fc.assert(
        fc.asyncProperty(anyRequest, async (request) => {
          const outcome = await send(request);
          const what = describeRequest(request);
          if (outcome.kind === 'no-answer') expect.fail(`no answer (${outcome.detail}) to ${what}`);
          if (outcome.kind === 'reply' && outcome.reply.status >= 500 && !(await answersItself(request))) {
            const { status, headers, body } = outcome.reply;
            expect(status, `${what}: ${body.toString().slice(0, 300)}`).toBe(503);
            expect(headers['retry-after'], `${what}: Retry-After`).toBeDefined();
          }
          await stillAnswers();
        }),
        { numRuns: RUNS },
      );
    });

    it('answers one request resent in other pieces, after hang-ups or all at once, the same every time', async () => {
      await fc.assert(
        fc.asyncProperty(resentRequest, async (sent) => {
          const key = `${sent.stem}-${++serial}`;
          const [method, target] = sent.target;
          const base = {
            method,
            target,
            headers: [[sent.keyName, sent.quoted ? `"${key}"` : key] as Header, ...sent.types, ...sent.odd],
            body: sent.body,
            framing: sent.framing,
          };
          const requests: RawRequest[] = sent.deliveries.map((delivery) => ({ ...base, ...delivery }));
          let outcomes: RawOutcome[];
          if (sent.together) outcomes = await Promise.all(requests.map(send));
          else {
            outcomes = [];
            for (const request of requests) outcomes.push(await send(request));
          }
          const what = describeRequest(requests[0]!);
          const replies = outcomes.flatMap((outcome) => (outcome.kind === 'reply' ? [outcome.reply] : []));
          expect(replies.length, `${what}: answers to the deliveries not hung up`).toBe(
            sent.deliveries.filter((delivery) => delivery.hangUp.at === 'never').length,
          );
          const first = replies[0]!;
          for (const reply of replies) {
            expect(reply.status, what).toBe(first.status);
            if (first.status < 300) expect(decoded(reply), what).toBe(decoded(first));
          }
          await stillAnswers();
        }),
        { numRuns: RUNS },
      );
    });

    it('leaves no key in progress once the server has closed', async () => {
      closed = true;
      await app.close();
      // Handlers of hung-up requests may still be finishing: their keys must settle, not stay claimed.
      await vi.waitFor(
        async () => {
          const stuck = await inProgress(store);
          expect(stuck.map(({ key }) => ({ key, sentIn: sentBy.get(key) }))).toEqual([]);
        },
        { timeout: 10_000, interval: 20 },
      );
      expect(unhandled, 'errors nobody handled').toEqual([]);
    });
  });
}
