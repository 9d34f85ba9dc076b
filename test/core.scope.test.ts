import { createHash, createHmac } from 'node:crypto';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../src/core/contract/index.js';
import { resolveOptions } from '../src/core/options/index.js';
import { credentialScope } from '../src/core/request/index.js';
import { memoryStore } from '../src/stores/memory.js';

const SECRET = 'a deployment secret of 32 bytes!';

describe('credentialScope', () => {
  it('with a secret is the HMAC-SHA-256 of the whole credential, base64url, for any text', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary' }), (credential) => {
        const scope = credentialScope(credential, SECRET);
        expect(scope).toBe(
          `hmac-sha256:${createHmac('sha256', SECRET).update(credential).digest('base64url')}`,
        );
        expect(scope).not.toContain(createHash('sha256').update(credential).digest('base64url'));
      }),
    );
  });

  it('differs between two secrets, and takes the secret as bytes too', () => {
    const other = 'another deployment secret, 32 b!';
    expect(credentialScope('Basic dXNlcjpodW50ZXIy', SECRET)).not.toBe(
      credentialScope('Basic dXNlcjpodW50ZXIy', other),
    );
    expect(credentialScope('Bearer abc', Buffer.from(SECRET))).toBe(credentialScope('Bearer abc', SECRET));
  });

  it('refuses a secret shorter than 16 bytes', () => {
    expect(() => credentialScope('Bearer abc', 'short')).toThrow(ConfigError);
    expect(() => credentialScope(undefined, new Uint8Array(15))).toThrow(/at least 16 bytes/);
  });

  it('without a secret is the sha256 of the whole credential, base64url', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary' }), (credential) => {
        expect(credentialScope(credential)).toBe(
          `sha256:${createHash('sha256').update(credential).digest('base64url')}`,
        );
      }),
    );
    expect(credentialScope('Bearer abc')).toBe('sha256:w1Xc6WwWEogNEZQP_dkBTThsJT4MNlKmzQanIm970rY');
  });

  it('is empty without a credential', () => {
    expect(credentialScope(undefined)).toBe('');
    expect(credentialScope(undefined, SECRET)).toBe('');
  });
});

describe('the default scope with scopeSecret', () => {
  const store = memoryStore();
  const request = { authorization: 'Basic dXNlcjpodW50ZXIy' } as never;

  it('is credentialScope(authorization, scopeSecret)', async () => {
    const { scopeOf } = resolveOptions({ store, scopeSecret: SECRET });
    expect(await scopeOf(request)).toBe(credentialScope('Basic dXNlcjpodW50ZXIy', SECRET));
    expect(await resolveOptions({ store }).scopeOf(request)).toBe(credentialScope('Basic dXNlcjpodW50ZXIy'));
  });

  it('refuses a short secret with a ConfigError naming the option', () => {
    expect(() => resolveOptions({ store, scopeSecret: 'short' })).toThrow(/option `scopeSecret`/);
  });
});
