import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { type CapturedResponse, createIdempotency } from '../src/core/adapter.js';
import { ConfigError, type IdempotencyOptions, IETF_DRAFT_ERRORS_URL } from '../src/core/index.js';
import type { IdempotencyStore, StoredResponse } from '../src/core/store.js';
import { memoryStore } from '../src/stores/memory.js';
import { postRequest as request } from '../src/testing/engine-request.js';
import { signal } from '../src/testing/signal.js';
import { closedAfterEach } from './support/open-stores.js';

const closing = closedAfterEach();

function engine(options: Partial<IdempotencyOptions<{ token?: string }>> = {}) {
  const store = closing(options.store ?? memoryStore());
  return createIdempotency<{ token?: string }>({ scope: (req) => req.token ?? '', ...options, store });
}

/** A handler that counts its runs and answers 201 with the run number. */
function counter(response: Partial<CapturedResponse> = {}) {
  const state = { runs: 0 };
  const run = async (): Promise<CapturedResponse> => {
    state.runs += 1;
    return {
      status: 201,
      headers: {
        'content-type': 'application/json',
        location: `/loans/${state.runs}`,
        'set-cookie': 'session=secret',
        date: 'Sun, 29 Nov 2026 08:00:00 GMT',
        'x-request-id': `r${state.runs}`,
      },
      body: Buffer.from(JSON.stringify({ id: state.runs })),
      complete: true,
      ...response,
    };
  };
  return Object.assign(state, { run });
}

const text = (response: StoredResponse) => Buffer.from(response.body).toString();

describe('engine outcomes', () => {
  it('passes through methods that are not guarded and keyless requests on optional routes', async () => {
    const idem = engine();
    const handler = counter();
    expect(await idem.handle(request('k1', {}, { method: 'GET' }), handler.run)).toEqual({ kind: 'pass' });
    expect(await idem.handle(request('k1', {}, { method: 'PUT' }), handler.run)).toEqual({ kind: 'pass' });
    expect(await idem.handle(request(undefined), handler.run)).toEqual({ kind: 'pass' });
    expect(handler.runs).toBe(0);
  });

  it('answers 400 when a required key is missing, before reading the body', async () => {
    const idem = engine({ required: true });
    let bodyRead = false;
    const outcome = await idem.handle(
      request(
        undefined,
        {},
        {
          readBody: async () => {
            bodyRead = true;
            return Buffer.alloc(0);
          },
        },
      ),
      counter().run,
    );
    expect(outcome.kind === 'rejected' && outcome.error.status).toBe(400);
    expect(outcome.kind === 'rejected' && outcome.error.code).toBe('idempotency_key_missing');
    expect(bodyRead).toBe(false);
  });

  it.each([[''], ['a'.repeat(256)], [['a', 'b']], ['"unterminated']])(
    'answers 400 to the malformed key %j without running the handler',
    async (key) => {
      const idem = engine();
      const handler = counter();
      const outcome = await idem.handle(request(key), handler.run);
      expect(outcome.kind === 'rejected' && outcome.error.code).toBe('idempotency_key_invalid');
      expect(handler.runs).toBe(0);
    },
  );

  it.each([
    ['Idempotent-Replayed', { 'idempotent-replayed': 'true' }],
    [false, {}],
  ] as const)('marks a replay with replayedHeader %j', async (replayedHeader, mark) => {
    const idem = engine({ replayedHeader });
    const handler = counter();
    await idem.handle(request('OD-7f22'), handler.run);
    const second = await idem.handle(request('OD-7f22'), handler.run);
    expect(second.kind === 'replayed' && second.response.headers).toEqual({
      'content-type': 'application/json',
      location: '/loans/1',
      ...mark,
    });
  });

  it('runs once, then replays status, allowed headers and body with Idempotency-Replayed', async () => {
    const idem = engine({ replayHeaders: ['X-Request-Id'] });
    const handler = counter();
    const first = await idem.handle(request('OD-7f21'), handler.run);
    expect(first.kind).toBe('executed');
    const second = await idem.handle(request('OD-7f21', { isbn: 'K-02', member: 'U-1001' }), handler.run);
    expect(handler.runs).toBe(1);
    expect(second.kind).toBe('replayed');
    if (second.kind !== 'replayed') return;
    expect(second.response.status).toBe(201);
    expect(text(second.response)).toBe('{"id":1}');
    expect(second.response.headers).toEqual({
      'content-type': 'application/json',
      location: '/loans/1',
      'x-request-id': 'r1',
      'idempotency-replayed': 'true',
    });
  });

  it('rejects a key reused with another body: 409, or 422 problem+json under the ietf profile', async () => {
    for (const [profile, status] of [
      ['default', 409],
      ['ietf', 422],
    ] as const) {
      const idem = engine({ profile });
      const handler = counter();
      await idem.handle(request('k'), handler.run);
      const outcome = await idem.handle(request('k', { member: 'U-1002', isbn: 'K-03' }), handler.run);
      expect(handler.runs).toBe(1);
      if (outcome.kind !== 'rejected') throw new Error(`expected a rejection, got ${outcome.kind}`);
      const rendered = idem.render(outcome.error);
      expect(rendered.status).toBe(status);
      if (profile === 'ietf') {
        expect(rendered.headers['content-type']).toBe('application/problem+json');
        // The draft's §2.7 documents these errors: its link is the problem's type (titled as the
        // draft titles it) and a Link header; the code rides along as an extension member.
        expect(JSON.parse(text(rendered))).toEqual({
          type: IETF_DRAFT_ERRORS_URL,
          title: 'Idempotency-Key is already used',
          status: 422,
          detail: expect.stringContaining('already used'),
          code: 'key_conflict',
        });
        expect(rendered.headers.link).toBe(`<${IETF_DRAFT_ERRORS_URL}>; rel="describedby"`);
      } else {
        expect(JSON.parse(text(rendered))).toMatchObject({ error: 'key_conflict', key: 'k' });
        expect(rendered.headers.link).toBeUndefined();
      }
    }
  });

  it('docsUrl: the problem type and a describedby Link on every error; the default profile gets the Link', async () => {
    const docsUrl = 'https://developer.example.com/idempotency';
    for (const profile of ['default', 'ietf'] as const) {
      const idem = engine({ profile, docsUrl, required: true });
      const missing = await idem.handle(request(undefined), counter().run);
      if (missing.kind !== 'rejected') throw new Error(`expected a rejection, got ${missing.kind}`);
      const rendered = idem.render(missing.error);
      expect(rendered.status).toBe(400);
      expect(rendered.headers.link).toBe(`<${docsUrl}>; rel="describedby"`);
      const body = JSON.parse(text(rendered));
      if (profile === 'ietf') {
        expect(body).toMatchObject({ type: docsUrl, title: 'Idempotency-Key is missing', status: 400 });
      } else {
        expect(body).toMatchObject({ error: 'idempotency_key_missing' });
      }
    }
  });

  it('docsUrl must be an absolute URL that fits a Link header', () => {
    for (const docsUrl of ['/docs/idempotency', 'https://x.example/a b', 'https://x.example/<a>', 42]) {
      expect(() => engine({ docsUrl: docsUrl as string })).toThrow(/`docsUrl`/);
    }
  });

  it('the ietf profile answers a duplicate of an in-progress request 409 at once, unless concurrency is set', async () => {
    for (const [options, expected] of [
      [{ profile: 'ietf' }, 'rejected'],
      [{ profile: 'ietf', concurrency: 'wait' }, 'replayed'],
    ] as const) {
      const gate = signal();
      const inner = memoryStore();
      let waits = 0;
      // A duplicate that waits wakes the original, so a wrong answer fails instead of hanging.
      const store: IdempotencyStore = Object.assign(Object.create(inner), {
        wait: (scope: string, key: string, timeoutMs: number) => {
          waits += 1;
          gate.resolve();
          return inner.wait(scope, key, timeoutMs);
        },
      });
      const idem = engine({ ...options, store });
      const running = signal();
      const original = idem.handle(request('k'), async () => {
        running.resolve();
        await gate.promise;
        return counter().run();
      });
      await running.promise;
      const outcome = await idem.handle(request('k'), counter().run);
      gate.resolve();
      await original;
      expect(outcome.kind).toBe(expected);
      if (outcome.kind !== 'rejected') continue;
      expect(waits).toBe(0);
      expect(outcome.error.status).toBe(409);
      expect(Number(outcome.error.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expect(JSON.parse(text(idem.render(outcome.error)))).toMatchObject({
        title: 'A request is outstanding for this Idempotency-Key',
        status: 409,
      });
    }
  });

  it('rejects the same key on another path or method', async () => {
    const idem = engine();
    const handler = counter();
    await idem.handle(request('k'), handler.run);
    const otherPath = await idem.handle(request('k', undefined, { path: '/holds' }), handler.run);
    const otherMethod = await idem.handle(request('k', undefined, { method: 'PATCH' }), handler.run);
    expect([otherPath.kind, otherMethod.kind]).toEqual(['rejected', 'rejected']);
    expect(handler.runs).toBe(1);
  });

  it('keeps scopes apart: the same key from two clients is two operations', async () => {
    const idem = engine();
    const handler = counter();
    const a = await idem.handle(request('k', undefined, { raw: { token: 'alice' } }), handler.run);
    const b = await idem.handle(request('k', undefined, { raw: { token: 'bob' } }), handler.run);
    expect([a.kind, b.kind]).toEqual(['executed', 'executed']);
    expect(handler.runs).toBe(2);
  });

  it('scopes by a digest of Authorization when no scope is given; callers without one share a scope', async () => {
    const store = memoryStore();
    const claimed: string[] = [];
    const spy: IdempotencyStore = {
      ...store,
      claim: (input) => {
        claimed.push(input.scope);
        return store.claim(input);
      },
    };
    const idem = engine({ store: spy, scope: undefined });
    const handler = counter();
    const as = (authorization: string | undefined) => request('k', undefined, { authorization });
    const basic = (user: string) => `Basic ${Buffer.from(`${user}:secret`).toString('base64')}`;
    const callers = [basic('alice'), basic('bob'), 'Bearer A B', 'Bearer A', undefined];
    for (const authorization of callers) {
      expect((await idem.handle(as(authorization), handler.run)).kind).toBe('executed');
    }
    expect(handler.runs).toBe(callers.length);
    for (const authorization of callers) {
      expect((await idem.handle(as(authorization), handler.run)).kind).toBe('replayed');
    }
    // The credential never reaches the store: only its digest does.
    expect(claimed.join('\n')).not.toMatch(/alice|Bearer|Basic|secret/);
    expect(new Set(claimed).size).toBe(callers.length);
  });

  it('makes a duplicate wait for the in-progress original, then replays it', async () => {
    const idem = engine({ wait: '5s' });
    const gate = signal();
    const handler = counter();
    const slow = async () => {
      await gate.promise;
      return handler.run();
    };
    const original = idem.handle(request('k'), slow);
    await sleep(10);
    const duplicate = idem.handle(request('k'), slow);
    await sleep(20);
    gate.resolve();
    const [first, second] = await Promise.all([original, duplicate]);
    expect(first.kind).toBe('executed');
    expect(second.kind).toBe('replayed');
    expect(handler.runs).toBe(1);
  });

  it('answers 409 + Retry-After at once under concurrency: reject, and after waitMs otherwise', async () => {
    for (const options of [{ concurrency: 'reject' as const }, { wait: 30 }]) {
      const idem = engine(options);
      const gate = signal();
      const original = idem.handle(request('k'), async () => {
        await gate.promise;
        return counter().run();
      });
      await sleep(5);
      const outcome = await idem.handle(request('k'), counter().run);
      gate.resolve();
      await original;
      if (outcome.kind !== 'rejected') throw new Error(`expected a rejection, got ${outcome.kind}`);
      expect(outcome.error.status).toBe(409);
      expect(outcome.error.code).toBe('request_in_progress');
      expect(Number(outcome.error.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
  });

  it('releases the key when the handler throws, so the retry runs', async () => {
    const idem = engine();
    const handler = counter();
    await expect(
      idem.handle(request('k'), async () => {
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    expect((await idem.handle(request('k'), handler.run)).kind).toBe('executed');
    expect(handler.runs).toBe(1);
  });

  it('releases the key on 5xx and on a response that was streamed, not kept', async () => {
    const idem = engine();
    for (const [i, failure] of [{ status: 503 }, { complete: false }].entries()) {
      const key = `k-${i}`;
      const first = counter(failure);
      await idem.handle(request(key), first.run);
      const retry = counter();
      expect((await idem.handle(request(key), retry.run)).kind).toBe('executed');
      expect(retry.runs).toBe(1);
    }
  });

  it('by default releases 400, 413, 415, 422 and 429 and keeps every other status below 500', async () => {
    const idem = engine();
    for (const status of [400, 413, 415, 422, 429]) {
      const key = `released-${status}`;
      const refused = counter({ status });
      expect((await idem.handle(request(key, { isbn: 'K-99' }), refused.run)).kind).toBe('executed');
      // The corrected request under the same key runs: the refusal did not burn the key.
      const corrected = counter();
      expect((await idem.handle(request(key), corrected.run)).kind).toBe('executed');
      expect(corrected.runs).toBe(1);
    }
    for (const status of [200, 201, 202, 204, 301, 401, 403, 404, 409, 410]) {
      const key = `kept-${status}`;
      await idem.handle(request(key), counter({ status }).run);
      const retry = await idem.handle(request(key), counter().run);
      expect(retry.kind === 'replayed' && retry.response.status, String(status)).toBe(status);
    }
  });

  it('lets storeStatus decide what is kept', async () => {
    const idem = engine({ storeStatus: (status) => status < 400 });
    const handler = counter({ status: 422 });
    await idem.handle(request('k'), handler.run);
    await idem.handle(request('k'), handler.run);
    expect(handler.runs).toBe(2);
  });

  it('treats a key older than the retention window as a new operation', async () => {
    const idem = engine({ ttl: 40, lease: 20 });
    const handler = counter();
    await idem.handle(request('k'), handler.run);
    expect((await idem.handle(request('k'), handler.run)).kind).toBe('replayed');
    await sleep(60);
    expect((await idem.handle(request('k'), handler.run)).kind).toBe('executed');
    expect(handler.runs).toBe(2);
  });

  it("renews a running handler's claim, and stops once the handler answers or throws", async () => {
    const inner = memoryStore();
    const renewed: string[] = [];
    const idem = engine({
      lease: 90,
      store: {
        ...inner,
        renew: (scope, key, token, leaseMs) => {
          renewed.push(key);
          return inner.renew(scope, key, token, leaseMs);
        },
      },
    });
    const slow = (fail: boolean) => async () => {
      await sleep(300);
      if (fail) throw new Error('handler failed');
      return counter().run();
    };
    expect((await idem.handle(request('answers'), slow(false))).kind).toBe('executed');
    await expect(idem.handle(request('throws'), slow(true))).rejects.toThrow('handler failed');
    expect(renewed.filter((key) => key === 'answers').length).toBeGreaterThanOrEqual(2);
    expect(renewed.filter((key) => key === 'throws').length).toBeGreaterThanOrEqual(2);
    const sent = renewed.length;
    await sleep(200);
    expect(renewed).toHaveLength(sent);
  });

  it('answers 503 and never runs the handler when the store fails or hangs', async () => {
    const failing: IdempotencyStore = {
      ...memoryStore(),
      name: 'failing',
      claim: async () => {
        throw new Error('connection refused');
      },
    };
    const hanging: IdempotencyStore = {
      ...memoryStore(),
      name: 'hanging',
      claim: () => new Promise(() => {}),
    };
    for (const store of [failing, hanging]) {
      const idem = engine({ store, storeTimeout: 50 });
      const handler = counter();
      const outcome = await idem.handle(request('k'), handler.run);
      if (outcome.kind !== 'rejected') throw new Error(`expected a rejection, got ${outcome.kind}`);
      expect(outcome.error.status).toBe(503);
      expect(JSON.parse(text(idem.render(outcome.error)))).toMatchObject({ error: 'store_unavailable' });
      expect(handler.runs).toBe(0);
    }
  });

  it('encrypts stored bodies and decrypts replays; a wrong key cannot read them', async () => {
    const saved: StoredResponse[] = [];
    const inner = memoryStore();
    const spy: IdempotencyStore = {
      ...inner,
      complete: (scope, key, token, response) => {
        saved.push(response);
        return inner.complete(scope, key, token, response);
      },
    };
    const encryptionKey = Buffer.alloc(32, 7).toString('base64');
    const idem = engine({ store: spy, encryptionKey });
    const handler = counter();
    await idem.handle(request('k'), handler.run);
    expect(Buffer.from(saved[0]!.body).toString()).not.toContain('"id"');
    const replay = await idem.handle(request('k'), handler.run);
    expect(replay.kind === 'replayed' && text(replay.response)).toBe('{"id":1}');
    const otherKey = createIdempotency({ store: spy, encryptionKey: Buffer.alloc(32, 8) });
    const unreadable = await otherKey.handle(request('k'), handler.run);
    expect(unreadable.kind === 'rejected' && unreadable.error.code).toBe('replay_unreadable');
  });

  it('decrypts with any key of the ring and encrypts with the first, so a rotation keeps replays', async () => {
    const store = closing(memoryStore());
    const [oldKey, newKey, unknownKey, otherUnknownKey] = [1, 2, 3, 4].map((n) =>
      Buffer.alloc(32, n).toString('base64'),
    );
    const handler = counter();
    const withKeys = (encryptionKey: string | string[]) => createIdempotency({ store, encryptionKey });
    await withKeys(oldKey!).handle(request('before'), handler.run);
    const rotated = withKeys([newKey!, oldKey!]);
    const replay = await rotated.handle(request('before'), handler.run);
    expect(replay.kind === 'replayed' && text(replay.response)).toBe('{"id":1}');
    await rotated.handle(request('after'), handler.run);
    const afterRotation = await withKeys(newKey!).handle(request('after'), handler.run);
    expect(afterRotation.kind === 'replayed' && text(afterRotation.response)).toBe('{"id":2}');
    const unknown = await withKeys([unknownKey!, otherUnknownKey!]).handle(request('before'), handler.run);
    expect(unknown.kind === 'rejected' && unknown.error.status).toBe(500);
    expect(unknown.kind === 'rejected' && unknown.error.code).toBe('replay_unreadable');
    expect(handler.runs).toBe(2);
  });

  it('hands the handler its key and a stable downstream key per purpose and scope', async () => {
    const idem = engine();
    const keys: string[] = [];
    const derived: string[] = [];
    const run = async (ctx: { key: string; downstreamKey(p: string): string }) => {
      keys.push(ctx.key);
      derived.push(ctx.downstreamKey('payments'), ctx.downstreamKey('email'));
      expect(ctx.downstreamKey('payments')).toBe(derived.at(-2));
      return counter().run();
    };
    await idem.handle(request('k1', undefined, { raw: { token: 'a' } }), run);
    await idem.handle(request('k1', undefined, { raw: { token: 'b' } }), run);
    expect(keys).toEqual(['k1', 'k1']);
    expect(new Set(derived).size).toBe(4);
  });

  it('never answers 5xx nor throws, whatever the body: executes once, then replays', async () => {
    const idem = engine();
    const deep = `${'['.repeat(200_000)}${']'.repeat(200_000)}`;
    // JSON texts RFC 8785 has no canonical form for, or too deep for a recursive canonicaliser.
    const edge = fc.constantFrom('1e400', '-1e400', '"\\ud800"', '"a\\udc00b"', '{"n":1e999}', deep);
    const anyCodeUnit = fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c));
    const text = fc.oneof(
      fc.json(),
      fc.jsonValue({ stringUnit: anyCodeUnit }).map((value) => JSON.stringify(value)),
      fc.tuple(fc.jsonValue(), edge).map(([value, edgeText]) => `[${JSON.stringify(value)},${edgeText}]`),
      edge,
    );
    const body = fc.oneof(
      text.map((t) => Buffer.from(t)),
      fc.uint8Array({ maxLength: 64 }).map((bytes) => Buffer.from(bytes)),
    );
    const contentType = fc.constantFrom(
      'application/json',
      'application/merge-patch+json',
      'text/plain',
      undefined,
    );
    let n = 0;
    await fc.assert(
      fc.asyncProperty(body, contentType, async (bytes, type) => {
        const key = `prop-${n++}`;
        const at = () => request(key, undefined, { contentType: type, readBody: async () => bytes });
        const handler = counter();
        const first = await idem.handle(at(), handler.run);
        expect(first.kind === 'executed' && first.response.status).toBe(201);
        const retry = await idem.handle(at(), handler.run);
        expect(retry.kind === 'replayed' && retry.response.status).toBe(201);
        expect(handler.runs).toBe(1);
      }),
      { numRuns: 300 },
    );
  });

  it('takes the key from a custom extractor, checked as a header value would be', async () => {
    const idem = engine({ key: (req) => req.token });
    const handler = counter();
    const first = await idem.handle(
      request(undefined, undefined, { raw: { token: 'order-7' } }),
      handler.run,
    );
    const second = await idem.handle(
      request('ignored', undefined, { raw: { token: 'order-7' } }),
      handler.run,
    );
    expect([first.kind, second.kind]).toEqual(['executed', 'replayed']);
    expect((await idem.handle(request('k-1'), handler.run)).kind).toBe('pass');
    const bad = await idem.handle(request(undefined, undefined, { raw: { token: 'a b' } }), handler.run);
    expect(bad).toMatchObject({ kind: 'rejected', error: { status: 400 } });
    expect(handler.runs).toBe(1);
  });

  it('maps a 413 thrown by the body reader to a rejection', async () => {
    const idem = engine({ maxBodyBytes: 10 });
    const outcome = await idem.handle(
      request(
        'k',
        {},
        {
          readBody: async () => {
            throw idem.bodyTooLarge();
          },
        },
      ),
      counter().run,
    );
    expect(outcome.kind === 'rejected' && outcome.error.status).toBe(413);
  });
});

describe('engine options', () => {
  it.each([
    [{ ttl: 'forever' }, '`ttl`'],
    [{ ttl: -5 }, '`ttl`'],
    [{ wait: 'soon' }, '`wait`'],
    [{ mode: 'atomic' }, "`mode: 'atomic'`"],
    [{ mode: 'eventually' }, '`mode`'],
    [{ concurrency: 'queue' }, '`concurrency`'],
    [{ profile: 'stripe' }, '`profile`'],
    [{ replayedHeader: 'Replayed?' }, '`replayedHeader`'],
    [{ replayedHeader: true }, '`replayedHeader`'],
    [{ maxKeyLength: 0 }, '`maxKeyLength`'],
    [{ minKeyLength: 10, maxKeyLength: 5 }, '`minKeyLength`'],
    [{ methods: 'POST' }, '`methods`'],
    [{ scope: 'tenant' }, '`scope`'],
    [{ encryptionKey: 'c2hvcnQ=' }, '`encryptionKey`'],
    [{ encryptionKey: [] }, '`encryptionKey`'],
    [{ encryptionKey: [Buffer.alloc(32).toString('base64'), 'c2hvcnQ='] }, '`encryptionKey[1]`'],
  ])('rejects %j naming the option', (bad, name) => {
    expect(() => engine(bad as Partial<IdempotencyOptions>)).toThrow(ConfigError);
    expect(() => engine(bad as Partial<IdempotencyOptions>)).toThrow(name);
  });

  it.each([
    [{ headerName: 'Idempotency Key' }, '`headerName`'],
    [{ key: 'query.key' }, '`key`'],
  ])('rejects %j naming the option', (bad, name) => {
    expect(() => engine(bad as Partial<IdempotencyOptions>)).toThrow(name);
  });

  it('requires a store', () => {
    expect(() => createIdempotency({} as IdempotencyOptions)).toThrow('`store`');
  });

  it('refuses a store without renew in lease mode, naming it', () => {
    const { renew: _, ...withoutRenew } = memoryStore();
    expect(() => engine({ store: withoutRenew as IdempotencyStore })).toThrow(ConfigError);
    expect(() => engine({ store: withoutRenew as IdempotencyStore })).toThrow('`renew`');
  });

  it.each([
    [{}, 10_000],
    [{ ttl: '2s' }, 2_000],
  ] as const)(
    'claims with a 10 s lease by default, never longer than retention (%j)',
    async (options, expected) => {
      const inner = memoryStore();
      const leases: number[] = [];
      const idem = engine({
        ...options,
        store: {
          ...inner,
          claim: (input) => {
            leases.push(input.leaseMs);
            return inner.claim(input);
          },
        },
      });
      await idem.handle(request('k'), counter().run);
      expect(leases).toEqual([expected]);
    },
  );

  it('accepts a lease longer than retention, and shortens it to retention', () => {
    expect(() => engine({ lease: '2d', ttl: '1d' })).not.toThrow();
  });

  it('accepts durations as numbers of ms or strings', () => {
    expect(() => engine({ ttl: '7d', lease: '30s', wait: 250 })).not.toThrow();
  });
});
