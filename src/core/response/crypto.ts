import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { ConfigError } from '../contract/index.js';

const IV_BYTES = 12;
const TAG_BYTES = 16;

/** A 32-byte AES key, as bytes or base64. */
export type EncryptionKey = string | Uint8Array;

/** AES-256-GCM for stored bodies: iv ‖ tag ‖ ciphertext. */
export interface BodyCipher {
  seal(plain: Uint8Array): Uint8Array;
  open(sealed: Uint8Array): Uint8Array;
}

function secretOf(key: EncryptionKey, option: string): Buffer {
  const secret = typeof key === 'string' ? Buffer.from(key, 'base64') : Buffer.from(key);
  if (secret.length !== 32) {
    throw new ConfigError(
      `retrysafe: option \`${option}\` must be 32 bytes (a Uint8Array or a base64 string)`,
    );
  }
  return secret;
}

function openWith(secret: Buffer, data: Buffer): Buffer {
  const decipher = createDecipheriv('aes-256-gcm', secret, data.subarray(0, IV_BYTES));
  decipher.setAuthTag(data.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
  return Buffer.concat([decipher.update(data.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]);
}

/**
 * Seals with the first key of the ring and opens with whichever key sealed the body, so records
 * written before a rotation still replay. A body no key of the ring opens throws the last key's
 * authentication error.
 */
export function bodyCipher(keys: EncryptionKey | readonly EncryptionKey[]): BodyCipher {
  const ring = Array.isArray(keys)
    ? keys.map((key, i) => secretOf(key, `encryptionKey[${i}]`))
    : [secretOf(keys as EncryptionKey, 'encryptionKey')];
  const current = ring[0];
  if (current === undefined) {
    throw new ConfigError('retrysafe: option `encryptionKey` must name at least one key');
  }
  return {
    seal(plain) {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv('aes-256-gcm', current, iv);
      const body = Buffer.concat([cipher.update(plain), cipher.final()]);
      return Buffer.concat([iv, cipher.getAuthTag(), body]);
    },
    open(sealed) {
      const data = Buffer.from(sealed);
      let failure: unknown;
      for (const secret of ring) {
        try {
          return openWith(secret, data);
        } catch (error) {
          failure = error;
        }
      }
      throw failure;
    },
  };
}
