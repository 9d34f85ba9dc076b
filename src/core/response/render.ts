import { STATUS_CODES } from 'node:http';
import { ErrorCode, IdempotencyError, type StoredResponse } from '../contract/index.js';
import { type ResponseShaping, withHeader, withKeyEcho } from './stored.js';

// A duplicate polls no slower than this while it waits, so a missed notification costs little.
export const MAX_WAIT_SLICE_MS = 1000;

export function storeDown(cause: unknown, key: string): IdempotencyError {
  return new IdempotencyError(
    503,
    ErrorCode.storeUnavailable,
    'The idempotency store is unavailable; the request was not processed. Retry with the same key.',
    { 'retry-after': '1' },
    key,
    { cause },
  );
}

/** The store's circuit breaker is open: refused without asking the store, retry after `retryAfterMs`. */
export function circuitOpen(key: string, retryAfterMs: number, failures: number): IdempotencyError {
  return new IdempotencyError(
    503,
    ErrorCode.storeUnavailable,
    `The idempotency store failed its last ${failures} calls; the request was not processed. Retry with the same key.`,
    { 'retry-after': String(Math.max(1, Math.ceil(retryAfterMs / 1000))) },
    key,
  );
}

export function replayUnreadable(cause: unknown, key: string): IdempotencyError {
  return new IdempotencyError(
    500,
    ErrorCode.replayUnreadable,
    'The stored response for this key cannot be decrypted with the configured encryptionKey.',
    {},
    key,
    { cause },
  );
}

export const operationAbandoned = (key: string, resumes: number) =>
  new IdempotencyError(
    500,
    ErrorCode.operationAbandoned,
    `The operation did not finish after ${resumes} attempts and was ended. Its finished steps may have taken effect; retrying with this key answers the same.`,
    {},
    key,
  );

export const conflict = (config: ResponseShaping, key: string) =>
  new IdempotencyError(
    config.mismatchStatus,
    ErrorCode.keyConflict,
    'This Idempotency-Key was already used with a different request (method, path or body).',
    {},
    key,
  );

export const inProgress = (key: string, retryAfterMs: number) =>
  new IdempotencyError(
    409,
    ErrorCode.inProgress,
    'A request with this Idempotency-Key is still being processed. Retry later with the same key.',
    { 'retry-after': String(Math.max(1, Math.ceil(Math.min(retryAfterMs, MAX_WAIT_SLICE_MS) / 1000))) },
    key,
  );

export const keyMissing = () =>
  new IdempotencyError(400, ErrorCode.keyMissing, 'This endpoint requires an Idempotency-Key header.');

export const keyInvalid = (reason: string) => new IdempotencyError(400, ErrorCode.keyInvalid, reason);

export const responseTooLarge = (config: ResponseShaping, key: string) =>
  new IdempotencyError(
    500,
    ErrorCode.responseTooLarge,
    `The response exceeded maxResponseBytes (${config.maxResponseBytes}); the operation was rolled back.`,
    {},
    key,
  );

export const bodyTooLarge = (config: ResponseShaping) =>
  new IdempotencyError(413, ErrorCode.bodyTooLarge, `The request body exceeds ${config.maxBodyBytes} bytes.`);

/** The HTTP response for an engine error: `onError`'s, or JSON (`ietf`: problem+json). */
export function render(config: ResponseShaping, error: IdempotencyError): StoredResponse {
  const rendered = renderError(config, error);
  if (error.key === undefined || config.echoKeyHeader === undefined) return rendered;
  return { ...rendered, headers: withKeyEcho(config, rendered.headers, error.key) };
}

// The draft's titles (§2.7) for the errors it describes; a problem whose `type` is a document
// rather than about:blank is titled by what went wrong, not by the status (RFC 9457 §3.1.3).
const TITLES: Partial<Record<ErrorCode, string>> = {
  [ErrorCode.keyMissing]: 'Idempotency-Key is missing',
  [ErrorCode.keyInvalid]: 'Idempotency-Key is malformed',
  [ErrorCode.keyConflict]: 'Idempotency-Key is already used',
  [ErrorCode.inProgress]: 'A request is outstanding for this Idempotency-Key',
};

function renderError(config: ResponseShaping, error: IdempotencyError): StoredResponse {
  const custom = config.onError?.(error);
  if (custom) return custom;
  const { docsUrl } = config;
  const headers =
    docsUrl === undefined
      ? error.headers
      : withHeader(error.headers, 'link', `<${docsUrl}>; rel="describedby"`);
  if (config.profile === 'ietf') {
    const phrase = STATUS_CODES[error.status] ?? 'Error';
    // RFC 9457 §4.2.1: a problem of type about:blank is titled with the status phrase; our code
    // rides along as an extension member.
    const problem = {
      type: docsUrl ?? 'about:blank',
      title: docsUrl === undefined ? phrase : (TITLES[error.code] ?? phrase),
      status: error.status,
      detail: error.message,
      code: error.code,
    };
    return {
      status: error.status,
      headers: withHeader(headers, 'content-type', 'application/problem+json'),
      body: Buffer.from(JSON.stringify(problem)),
    };
  }
  const payload = {
    error: error.code,
    message: error.message,
    ...(error.key === undefined ? {} : { key: error.key }),
  };
  return {
    status: error.status,
    headers: withHeader(headers, 'content-type', 'application/json; charset=utf-8'),
    body: Buffer.from(JSON.stringify(payload)),
  };
}
