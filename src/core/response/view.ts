import type { StoredResponse } from '../contract/index.js';
import { bodyCipher, type EncryptionKey } from './crypto.js';

/** A saved response as an operator reads it (`retrysafe keys show`, an admin API): JSON as is. */
export interface StoredResponseView {
  status: number;
  headers: Record<string, string>;
  /** The body as text, when its bytes are UTF-8. */
  body?: string;
  /** The body in base64, when it is not UTF-8 text (binary, compressed, or sealed and not opened). */
  bodyBase64?: string;
  /** `true` when `encryptionKey` was given and no key of it opens the body: no body is shown. */
  bodyUnreadable?: true;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * `response` (as `store.get(scope, key, { response: true })` returns it) for an operator's eyes:
 * the body opened with `encryptionKey` (the engine's option: a key or a key ring) when given, then
 * as text or base64. Without the key a sealed body shows as its ciphertext, in base64.
 * @example storedResponseView(record.response, { encryptionKey: process.env.IDEMPOTENCY_KEY })
 */
export function storedResponseView(
  response: StoredResponse,
  options: { encryptionKey?: EncryptionKey | readonly EncryptionKey[] } = {},
): StoredResponseView {
  const { status, headers } = response;
  let body = response.body;
  if (options.encryptionKey !== undefined) {
    const cipher = bodyCipher(options.encryptionKey);
    try {
      body = cipher.open(body);
    } catch {
      return { status, headers, bodyUnreadable: true };
    }
  }
  try {
    return { status, headers, body: utf8.decode(body) };
  } catch {
    return {
      status,
      headers,
      bodyBase64: Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('base64'),
    };
  }
}
