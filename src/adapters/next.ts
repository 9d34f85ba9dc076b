import { randomUUID } from 'node:crypto';
import { ConfigError, type RegisteredTx } from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import { type MutationIdempotencyOptions, mutationGuard } from './kit/mutation.js';

/**
 * The form field that carries a server action's key: render it as a hidden input whose value is
 * {@link actionKey}'s, inside the form the action serves.
 * @example <input type="hidden" name={KEY_FIELD} value={actionKey()} />
 */
export const KEY_FIELD = 'idempotency-key';

/**
 * A fresh key for one form, minted when the form renders (in a Server Component) and sent with
 * every submission of it as the {@link KEY_FIELD} hidden field. Render the page dynamically
 * (`await connection()` from `next/server`): a page prerendered at build time would hand every
 * visitor the same key, and the second visitor the first one's result.
 */
export const actionKey = (): string => randomUUID();

/**
 * Options of {@link idempotentAction}: `idempotent()`'s, less `key` and `fingerprint` (the form's).
 * `scope` is given the submitted FormData; read a session with `cookies()` from `next/headers` there.
 */
export type ActionIdempotencyOptions<Tx = RegisteredTx> = Omit<
  MutationIdempotencyOptions<FormData, Tx>,
  'scopeSecret'
>;

/** The submitted fields a replay must match: every field but the key and React's own (`$ACTION_…`). */
function fields(form: FormData): Array<[string, unknown]> {
  const kept: Array<[string, unknown]> = [];
  for (const [name, value] of form.entries()) {
    if (name === KEY_FIELD || name.startsWith('$ACTION_')) continue;
    kept.push([
      name,
      typeof value === 'string' ? value : { file: value.name, size: value.size, type: value.type },
    ]);
  }
  return kept;
}

// Each guarded call's context, by the FormData it was given.
const contexts = new WeakMap<FormData, IdempotencyContext<unknown>>();

/**
 * The context of the guarded action that was given `form`: `key`, `scope`, `downstreamKey(purpose)`
 * (a provider's idempotency key), `tx` in atomic mode; `undefined` when it ran without a key.
 * @example const { downstreamKey } = idempotencyOf(form);
 */
export function idempotencyOf<Tx = RegisteredTx>(form: FormData): IdempotencyContext<Tx> | undefined {
  return contexts.get(form) as IdempotencyContext<Tx> | undefined;
}

/**
 * Makes a Next.js server action idempotent per form: the first submission carrying a key (the
 * {@link KEY_FIELD} field of its FormData) runs `action`; a double submit, a resubmission after a
 * lost answer and a retried action with that key get its saved result (JSON) without running it
 * again, and one arriving while the first still runs waits for it. Other fields under a used key
 * throw `key_conflict` (409); an error thrown by `action` frees the key. The FormData is the last
 * FormData argument, so it wraps `(formData)` and `useActionState`'s `(previousState, formData)`
 * alike; a call without a key runs unguarded unless `required`. The action finds its context
 * with {@link idempotencyOf}.
 * @example
 * 'use server';
 * const store = memoryStore();
 * export const placeOrder = idempotentAction({ store }, async (previous, form) => addOrder(form.get('item')));
 */
export function idempotentAction<Args extends unknown[], Result, Tx = RegisteredTx>(
  options: ActionIdempotencyOptions<Tx>,
  action: (...args: Args) => Result | Promise<Result>,
): (...args: Args) => Promise<Result> {
  if ((options as { scopeSecret?: unknown })?.scopeSecret !== undefined) {
    throw new ConfigError('retrysafe: idempotentAction() has no `scopeSecret`: give `scope` instead');
  }
  const guard = mutationGuard<FormData, Tx>('idempotentAction()', options, []);
  if (typeof action !== 'function') {
    throw new ConfigError('retrysafe: idempotentAction() needs the server action as its second argument');
  }
  return async function guardedAction(...args: Args): Promise<Result> {
    const form = [...args].reverse().find((arg): arg is FormData => arg instanceof FormData);
    const value = form?.get(KEY_FIELD);
    if (form === undefined || value === null || value === undefined) {
      if (guard.required) throw guard.missing();
      return action(...args);
    }
    const key = guard.namedKey(value, `the form's \`${KEY_FIELD}\` field`);
    return guard.run(form, undefined, key, fields(form), (ctx) => {
      contexts.set(form, ctx);
      return action(...args);
    });
  };
}
