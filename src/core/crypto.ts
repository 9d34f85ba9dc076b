import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { ConfigError } from './errors.js';

const IV_BYTES = 12;
const TAG_BYTES = 16;

/** AES-256-GCM for stored bodies: iv ‖ tag ‖ ciphertext. */
export interface BodyCipher {
  seal(plain: Uint8Array): Uint8Array;
  open(sealed: Uint8Array): Uint8Array;
}

export function bodyCipher(key: string | Uint8Array): BodyCipher {
  const secret = typeof key === 'string' ? Buffer.from(key, 'base64') : Buffer.from(key);
  if (secret.length !== 32) {
    throw new ConfigError(
      'retrysafe: option `encryptionKey` must be 32 bytes (a Uint8Array or a base64 string)',
    );
  }
  return {
    seal(plain) {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv('aes-256-gcm', secret, iv);
      const body = Buffer.concat([cipher.update(plain), cipher.final()]);
      return Buffer.concat([iv, cipher.getAuthTag(), body]);
    },
    open(sealed) {
      const data = Buffer.from(sealed);
      const decipher = createDecipheriv('aes-256-gcm', secret, data.subarray(0, IV_BYTES));
      decipher.setAuthTag(data.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
      return Buffer.concat([decipher.update(data.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]);
    },
  };
}
