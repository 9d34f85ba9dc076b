import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError, type IdempotencyStore } from '../../src/core/contract/index.js';
import { memoryStore } from '../../src/stores/memory.js';
import type { RunningApp } from '../../src/testing/adapter-suite.js';

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
