import { describe, expect, it } from 'vitest';
import { readConfig } from '../examples/library-loans/config.js';

// The desk's settings as an operator meets them: durations in the package's own vocabulary, a bad
// one refused by name, and the lease passed on as set (the engine bounds it by retention).
describe("the loan desk's settings", () => {
  it('reads durations as retrysafe does', () => {
    const config = readConfig({ IDEMPOTENCY_TTL: '90m', IDEMPOTENCY_LEASE: '1.5s', IDEMPOTENCY_WAIT: '0s' });
    expect(config).toMatchObject({ ttlMs: 5_400_000, leaseMs: 1_500, waitMs: 0 });
    expect(readConfig({}).ttlMs).toBe(86_400_000);
  });

  it.each([
    ['IDEMPOTENCY_TTL', 'banana'],
    ['IDEMPOTENCY_LEASE', '0s'],
    ['IDEMPOTENCY_WAIT', '-1s'],
  ])('refuses %s=%s, naming it', (name, value) => {
    expect(() => readConfig({ [name]: value })).toThrow(new RegExp(`^${name}="${value}" is invalid`));
  });

  it('leaves a lease longer than retention as set: the engine bounds it, not the desk', () => {
    expect(readConfig({ IDEMPOTENCY_TTL: '1m', IDEMPOTENCY_LEASE: '1h' })).toMatchObject({
      ttlMs: 60_000,
      leaseMs: 3_600_000,
    });
  });
});
