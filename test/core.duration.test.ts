import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ConfigError, parseDuration } from '../src/core/index.js';

describe('parseDuration', () => {
  it('reads ms as a number or digits, and unit strings', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 1e9 }), (n) => {
        expect(parseDuration(n)).toBe(n);
        expect(parseDuration(String(n))).toBe(n);
        expect(parseDuration(`${n}s`)).toBe(n * 1000);
        expect(parseDuration(`${n} minutes`)).toBe(n * 60_000);
      }),
    );
    expect(parseDuration('7d')).toBe(604_800_000);
  });

  it.each(['', '7dd', 'soon', '-1s', Number.NaN, Number.POSITIVE_INFINITY])(
    'refuses %j with a ConfigError naming the setting',
    (value) => {
      expect(() => parseDuration(value, { name: 'IDEMPOTENCY_TTL', min: 1 })).toThrow(ConfigError);
      expect(() => parseDuration(value, { name: 'IDEMPOTENCY_TTL', min: 1 })).toThrow(/IDEMPOTENCY_TTL/);
    },
  );

  it('refuses a value below min', () => {
    expect(() => parseDuration('0s', { min: 1 })).toThrow(ConfigError);
  });
});
