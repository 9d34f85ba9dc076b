import crypto from 'node:crypto';
import { ConfigError } from '../contract/index.js';
import { sha256 } from './sha256.js';

/** A deployment's scope secret: a string or bytes, at least this long, so it cannot be guessed. */
export const MIN_SCOPE_SECRET_BYTES = 16;

/**
 * A scope naming one caller by a credential (an `Authorization` value, an API key) without keeping
 * it: `''`, the one scope of callers without credentials, when there is none. With `secret` (a
 * deployment secret of at least 16 bytes, the same on every server sharing the store) it is an
 * HMAC-SHA-256 of the whole value, `hmac-sha256:…`, which cannot be guessed back from the store
 * or an admin page without the secret. Without it, a plain sha256, `sha256:…`: a guessable
 * credential (a Basic password) can then be guessed back offline; pass a secret, or scope by an
 * account id your authentication resolved. Changing the secret changes every scope: keys taken
 * before no longer replay (they expire with their `ttl`).
 * The engine's default `scope` is this of the request's `Authorization` header, keyed by the
 * `scopeSecret` option.
 * @example
 * idempotency({ store, scope: (req) => credentialScope(req.headers['x-api-key'], process.env.SCOPE_SECRET) });
 */
export function credentialScope(credential: string | undefined, secret?: string | Uint8Array): string {
  if (secret !== undefined) checkScopeSecret(secret);
  if (credential === undefined) return '';
  if (secret === undefined) return `sha256:${sha256(credential, 'base64url')}`;
  return `hmac-sha256:${crypto.createHmac('sha256', secret).update(credential).digest('base64url')}`;
}

/** Throws a ConfigError unless `secret` is a string or bytes of at least 16 bytes. */
export function checkScopeSecret(secret: unknown, name = 'credentialScope: secret'): void {
  const bytes =
    typeof secret === 'string'
      ? Buffer.byteLength(secret)
      : secret instanceof Uint8Array
        ? secret.byteLength
        : -1;
  if (bytes < MIN_SCOPE_SECRET_BYTES) {
    throw new ConfigError(
      `retrysafe: ${name} must be a string or bytes of at least ${MIN_SCOPE_SECRET_BYTES} bytes`,
    );
  }
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
