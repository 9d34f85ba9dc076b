import { createHash } from 'node:crypto';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { credentialScope } from '../src/core/scope.js';

describe('credentialScope', () => {
  it('is the sha256 of the whole credential, base64url, for any text', () => {
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
  });
});
