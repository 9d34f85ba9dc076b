import { sha256 } from './sha256.js';

/**
 * A scope naming one caller by a credential (an `Authorization` value, an API key) without keeping
 * it: a sha256 digest of the whole value, so two credentials never share keys and the store never
 * holds the credential. `''`, the one scope of callers without credentials, when there is none.
 * The engine's default `scope` is this of the request's `Authorization` header.
 * A digest of a guessable credential (a Basic password) can be guessed back; scope by an account
 * id your authentication resolved when you have one.
 * @example
 * idempotency({ store, scope: (req) => credentialScope(req.headers['x-api-key']) });
 */
export function credentialScope(credential: string | undefined): string {
  if (credential === undefined) return '';
  return `sha256:${sha256(credential, 'base64url')}`;
}

/**
 * Longest scope a store is given as it is, in UTF-8 bytes. With a key of MAX_KEY_LENGTH it keeps
 * the index row of (scope, key) within PostgreSQL's 2,704 bytes.
 */
export const MAX_SCOPE_BYTES = 1024;

/**
 * `scope` as the stores key it: as it is, or a digest of it when it is longer than
 * MAX_SCOPE_BYTES (a `scope` function may return anything), so that every store holds it.
 */
export function storableScope(scope: string): string {
  if (scope.length * 3 <= MAX_SCOPE_BYTES || Buffer.byteLength(scope) <= MAX_SCOPE_BYTES) return scope;
  return `sha256-scope:${sha256(scope, 'base64url')}`;
}
