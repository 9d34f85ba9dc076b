import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError, type IdempotencyStore } from '../../src/core/contract/index.js';
import { memoryStore } from '../../src/stores/memory.js';
import type { RunningApp } from '../../src/testing/adapter-suite.js';
import { exchange, type RawOutcome } from '../../src/testing/raw-http.js';

/**
 * An adapter's own tests, beside the conformance suite: one memory store for the block, the apps
 * its tests start (`started` closes each after the block, with the store), and the check every
 * middleware factory owes, that bad options fail when it is built rather than on a request.
 */
export function describeAdapterSpecifics(
  name: string,
  idempotency: (options: never) => unknown,
  tests: (store: IdempotencyStore, started: (app: RunningApp) => RunningApp) => void,
): void {
  describe(name, () => {
    const store = memoryStore();
    const apps: RunningApp[] = [];
    afterAll(async () => {
      await Promise.all(apps.map((app) => app.close()));
      await store.close();
    });

    it('options are checked when the middleware is built', () => {
      expect(() => idempotency({ store, renderErrors: 'yes' } as never)).toThrow(ConfigError);
      expect(() => idempotency({ store, ttl: 'soon' } as never)).toThrow(/`ttl`/);
    });

    tests(store, (app) => {
      apps.push(app);
      return app;
    });
  });
}

/** `POST path` with the JSON body `{"a":1}`, keyed when `key` is given; the answer read as text. */
export async function postJson(app: RunningApp, path: string, key?: string) {
  const res = await fetch(app.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
    body: '{"a":1}',
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/**
 * Three POSTs with the key header twice and a 900 KiB body written in three pieces, each its
 * status (or how it failed). Found by the adapter fuzz (test/fuzz): a key refused before the body
 * was read, the connection closed on unread bytes and was reset, so the 400 was lost.
 */
export async function badKeyOnLargeUpload(app: RunningApp): Promise<Array<number | RawOutcome>> {
  const statuses: Array<number | RawOutcome> = [];
  for (let i = 0; i < 3; i++) {
    const outcome = await exchange(Number(new URL(app.url).port), {
      method: 'POST',
      target: '/orders',
      headers: [
        ['Idempotency-Key', 'a'],
        ['Idempotency-Key', 'b'],
        ['Content-Type', 'application/json'],
      ],
      body: Buffer.from(JSON.stringify({ pad: 'x'.repeat(900 * 1024) })),
      framing: { kind: 'length' },
      cuts: [0.01, 0.5],
      hangUp: { at: 'never' },
    });
    statuses.push(outcome.kind === 'reply' ? outcome.reply.status : outcome);
  }
  return statuses;
}
