import { describe, expect, it } from 'vitest';
import { actionKey, idempotencyOf, idempotentAction, KEY_FIELD } from '../src/adapters/next.js';
import { ConfigError, ErrorCode, IdempotencyError } from '../src/core/index.js';
import { memoryStore } from '../src/stores/memory.js';

/**
 * `retrysafe/next` as Next.js calls a server action: `(formData)` from `<form action>`, or
 * `(previousState, formData)` from `useActionState`. The browser half runs in
 * test/examples.nextjs.test.ts (`next build`, `next start`, Chromium).
 */

/** A form as the browser submits it: its fields, the hidden key, and React's own field. */
function form(fields: Record<string, string>, key?: string): FormData {
  const data = new FormData();
  for (const [name, value] of Object.entries(fields)) data.append(name, value);
  if (key !== undefined) data.append(KEY_FIELD, key);
  return data;
}

/** A guarded `(previous, form)` action that records each run; `fail` makes the next run throw. */
function orderAction(options: { required?: boolean } = {}) {
  const runs: string[] = [];
  let fail = false;
  const action = idempotentAction(
    { store: memoryStore(), ...options },
    async (_previous: unknown, data: FormData) => {
      if (fail) {
        fail = false;
        throw new Error('out of stock');
      }
      runs.push(String(data.get('item')));
      return { id: runs.length, item: String(data.get('item')) };
    },
  );
  return { action, runs, failNext: () => (fail = true) };
}

describe('idempotentAction', () => {
  it('mints a fresh key per render', () => {
    const keys = new Set(Array.from({ length: 100 }, actionKey));
    expect(keys.size).toBe(100);
    for (const key of keys) expect(key).toMatch(/^[\x21-\x7e]{1,255}$/);
  });

  it('a double submit, a resubmission and a retry of one form: one run, its result each time', async () => {
    const { action, runs } = orderAction();
    const key = actionKey();
    const first = await action(null, form({ item: 'book' }, key));
    // useActionState hands the previous answer back: not part of what must match.
    const again = await action(first, form({ item: 'book' }, key));
    const concurrent = await Promise.all([
      action(undefined, form({ item: 'book' }, key)),
      action({ error: 'no answer' }, form({ item: 'book' }, key)),
    ]);
    expect(runs).toEqual(['book']);
    for (const result of [again, ...concurrent]) expect(result).toEqual({ id: 1, item: 'book' });
  });

  it('concurrent first submissions of one key run once', async () => {
    const { action, runs } = orderAction();
    const key = actionKey();
    const results = await Promise.all(
      Array.from({ length: 10 }, () => action(null, form({ item: 'pen' }, key))),
    );
    expect(runs).toEqual(['pen']);
    expect(new Set(results.map((result) => JSON.stringify(result))).size).toBe(1);
  });

  it('wraps a plain (formData) action, and React’s $ACTION_ fields are not part of the match', async () => {
    const runs: string[] = [];
    const action = idempotentAction({ store: memoryStore() }, async (data: FormData) => {
      runs.push(String(data.get('item')));
      return runs.length;
    });
    const key = actionKey();
    const withReact = form({ item: 'cup', $ACTION_ID_abc: '' }, key);
    expect(await action(withReact)).toBe(1);
    expect(await action(form({ item: 'cup' }, key))).toBe(1);
    expect(runs).toEqual(['cup']);
  });

  it('the action finds its context with idempotencyOf(form); none without a key', async () => {
    const seen: Array<{ key?: string; provider?: string }> = [];
    const action = idempotentAction({ store: memoryStore() }, async (data: FormData) => {
      const ctx = idempotencyOf(data);
      seen.push({ key: ctx?.key, provider: ctx?.downstreamKey('charge') });
      return seen.length;
    });
    const key = actionKey();
    await action(form({ item: 'cup' }, key));
    await action(form({ item: 'cup' }));
    expect(seen[0]!.key).toBe(key);
    expect(seen[0]!.provider).toEqual(expect.any(String));
    expect(seen[1]).toEqual({ key: undefined, provider: undefined });
  });

  it('other fields under a used key: key_conflict (409), the action not run', async () => {
    const { action, runs } = orderAction();
    const key = actionKey();
    await action(null, form({ item: 'book' }, key));
    const refused = await action(null, form({ item: 'lamp' }, key)).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(IdempotencyError);
    expect(refused).toMatchObject({ status: 409, code: ErrorCode.keyConflict });
    expect(runs).toEqual(['book']);
  });

  it('an action that throws frees the key: the resubmission runs it', async () => {
    const { action, runs, failNext } = orderAction();
    const key = actionKey();
    failNext();
    await expect(action(null, form({ item: 'book' }, key))).rejects.toThrow('out of stock');
    expect(await action(null, form({ item: 'book' }, key))).toEqual({ id: 1, item: 'book' });
    expect(runs).toEqual(['book']);
  });

  it('without a key: runs unguarded, or refuses (400) when required', async () => {
    const optional = orderAction();
    await optional.action(null, form({ item: 'book' }));
    await optional.action(null, form({ item: 'book' }));
    expect(optional.runs).toEqual(['book', 'book']);
    const required = orderAction({ required: true });
    await expect(required.action(null, form({ item: 'book' }))).rejects.toMatchObject({
      status: 400,
      code: ErrorCode.keyMissing,
    });
    expect(required.runs).toEqual([]);
  });

  it.each(['', 'x'.repeat(256), 'bad\nkey'])('a malformed key (%j): 400, the action not run', async (key) => {
    const { action, runs } = orderAction();
    await expect(action(null, form({ item: 'book' }, key))).rejects.toMatchObject({
      status: 400,
      code: ErrorCode.keyInvalid,
    });
    expect(runs).toEqual([]);
  });

  it('refuses bad options when the module loads', () => {
    const action = async () => 1;
    expect(() => idempotentAction({} as never, action)).toThrow(ConfigError);
    expect(() =>
      idempotentAction({ store: memoryStore(), scopeSecret: 'x'.repeat(32) } as never, action),
    ).toThrow(/scopeSecret/);
    expect(() => idempotentAction({ store: memoryStore() }, 'placeOrder' as never)).toThrow(ConfigError);
  });
});
