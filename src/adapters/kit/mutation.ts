import { parseIdempotencyKey } from '../../core/adapter.js';
import { ConfigError, ErrorCode, IdempotencyError } from '../../core/contract/index.js';
import type { IdempotencyContext } from '../../core/engine/index.js';
import { IDEMPOTENT_OPTION_NAMES, type IdempotentOptions, idempotent } from '../../core/jobs/index.js';
import { checkOptions } from '../../core/options/index.js';
import { checkScopeSecret, credentialScope } from '../../core/request/index.js';
import { keyInvalid, keyMissing } from '../../core/response/index.js';

/** What a mutation guard hands `idempotent()`: the claim's key, scope and fingerprinted part. */
interface MutationCall {
  key: string;
  scope: string;
  operation: unknown;
}

/** Reads one request header, as Web `Headers` and Apollo's `HeaderMap` do. */
export type HeaderGetter = (name: string) => string | readonly string[] | null | undefined;

/**
 * The options every mutation guard (tRPC, GraphQL) takes: `idempotent()`'s, less what the guard
 * derives (`key`, `fingerprint`), with `scope` over the framework's context.
 */
export interface MutationIdempotencyOptions<Context, Tx = unknown>
  extends Omit<IdempotentOptions<MutationCall, Tx>, 'key' | 'fingerprint' | 'scope'> {
  /**
   * Refuse a guarded mutation that carries no key (`idempotency_key_missing`) instead of running it
   * unguarded.
   * @default false
   */
  required?: boolean;
  /**
   * Whose key it is: the same key from two scopes names two operations.
   * @default `credentialScope(authorization header, scopeSecret)`, as HTTP routes scope theirs
   * @example scope: (ctx) => ctx.user.id
   */
  scope?: (context: Context) => string | Promise<string>;
  /**
   * A secret (≥ 16 bytes, the same on every server) keying the default scope's HMAC, so a stored
   * scope cannot be guessed back to the credential.
   * @default undefined (a plain sha256 of the credential)
   */
  scopeSecret?: string | Uint8Array;
}

// `idempotent()`'s names less those a guard derives, and the guard's own.
const MUTATION_OPTION_NAMES = [
  ...IDEMPOTENT_OPTION_NAMES.filter((name) => name !== 'key' && name !== 'fingerprint'),
  'required',
  'scopeSecret',
];

// The HTTP engine's default bounds, so one key fits a route and a mutation alike.
const KEY_BOUNDS = { minLength: 1, maxLength: 255 };
const PRINTABLE_KEY = /^[\x20-\x7e]+$/;

/** The guard's view of one call: where its key came from is the framework's business. */
export interface MutationGuard<Context, Tx> {
  required: boolean;
  /** The key an `Idempotency-Key` header carries, `undefined` when absent; throws a 400 when malformed. */
  headerKey(headers: HeaderGetter | undefined): string | undefined;
  /** A key named in the input or a directive, checked against the header's bounds; throws a 400. */
  namedKey(value: unknown, where: string): string;
  /** The 400 for a guarded mutation without a key. */
  missing(): IdempotencyError;
  /** Runs `work` at most once per scope and key, every call of the key answered with its JSON result. */
  run<Result>(
    context: Context,
    headers: HeaderGetter | undefined,
    key: string,
    operation: unknown,
    work: (ctx: IdempotencyContext<Tx>) => Result | Promise<Result>,
  ): Promise<Result>;
}

const one = (value: string | readonly string[] | null | undefined) =>
  value === null ? undefined : typeof value === 'string' ? value : value?.[0];

/**
 * A mutation guard over `idempotent()`: the stored answer of a mutation is its resolver's JSON
 * result, its fingerprint the operation's name and input, its scope the caller's.
 */
export function mutationGuard<Context, Tx>(
  label: string,
  options: MutationIdempotencyOptions<Context, Tx>,
  extraNames: readonly string[],
): MutationGuard<Context, Tx> {
  const given = checkOptions(label, options, [...MUTATION_OPTION_NAMES, ...extraNames]);
  const { required = false, scope, scopeSecret, ...runOptions } = given;
  for (const name of extraNames) delete (runOptions as Record<string, unknown>)[name];
  if (typeof required !== 'boolean') throw configError(label, 'required', 'a boolean');
  if (scope !== undefined && typeof scope !== 'function') throw configError(label, 'scope', 'a function');
  if (scopeSecret !== undefined) checkScopeSecret(scopeSecret, `${label} option \`scopeSecret\``);
  const run = idempotent<MutationCall, Tx>({
    ...runOptions,
    key: (call) => call.key,
    fingerprint: (call) => call.operation,
    scope: (call) => call.scope,
  });

  return {
    required,
    headerKey(headers) {
      const parsed = parseIdempotencyKey(headers?.('idempotency-key') ?? undefined, KEY_BOUNDS);
      if (parsed.ok === 'absent') return undefined;
      if (parsed.ok === false) throw keyInvalid(parsed.reason);
      return parsed.key;
    },
    namedKey(value, where) {
      if (
        typeof value !== 'string' ||
        value.length < KEY_BOUNDS.minLength ||
        value.length > KEY_BOUNDS.maxLength ||
        !PRINTABLE_KEY.test(value)
      ) {
        throw keyInvalid(
          `${where} must be a string of ${KEY_BOUNDS.minLength} to ${KEY_BOUNDS.maxLength} printable ASCII characters`,
        );
      }
      return value;
    },
    missing: () =>
      new IdempotencyError(400, ErrorCode.keyMissing, keyMissing().message.replace('endpoint', 'mutation')),
    async run(context, headers, key, operation, work) {
      const scoped = scope
        ? await scope(context)
        : credentialScope(one(headers?.('authorization')), scopeSecret);
      return run({ key, scope: scoped, operation }, work);
    },
  };
}

const configError = (label: string, name: string, what: string) =>
  new ConfigError(`retrysafe: ${label} option \`${name}\` must be ${what}`);

/** What a client is told for each refusal, in a mutation's terms rather than a route's. */
export const MUTATION_MESSAGES: Partial<Record<ErrorCode, string>> = {
  [ErrorCode.keyConflict]:
    'This idempotency key was already used with another mutation or input; the mutation did not run.',
  [ErrorCode.inProgress]:
    'A mutation with this idempotency key is still in progress; it did not run again. Retry later with the same key.',
  [ErrorCode.storeUnavailable]:
    'The idempotency store is unavailable; the mutation did not run. Retry later with the same key.',
};

/** `error`'s message as a client of a mutation should read it. */
export const mutationMessage = (error: IdempotencyError) => MUTATION_MESSAGES[error.code] ?? error.message;
