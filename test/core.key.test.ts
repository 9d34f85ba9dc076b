import fc from 'fast-check';
import { serializeItem } from 'structured-headers';
import { describe, expect, it } from 'vitest';
import { parseIdempotencyKey } from '../src/core/request/index.js';

const bounds = { minLength: 1, maxLength: 255 };
const printable = fc.string({
  unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)),
});
const bareChar = fc
  .integer({ min: 0x21, max: 0x7e })
  .filter((c) => c !== 0x22 && c !== 0x2c)
  .map((c) => String.fromCharCode(c));
const bareKey = fc.string({ unit: bareChar, minLength: 1, maxLength: 255 });

describe('parseIdempotencyKey', () => {
  it('accepts the keys the seed clients send', () => {
    expect(parseIdempotencyKey('OD-7f21', bounds)).toEqual({ ok: true, key: 'OD-7f21' });
    expect(parseIdempotencyKey('550e8400-e29b-41d4-a716-446655440000', bounds)).toEqual({
      ok: true,
      key: '550e8400-e29b-41d4-a716-446655440000',
    });
    expect(parseIdempotencyKey('"8e03978e-40d5-43e8"', bounds)).toEqual({
      ok: true,
      key: '8e03978e-40d5-43e8',
    });
  });

  it('treats a missing header as absent', () => {
    expect(parseIdempotencyKey(undefined, bounds)).toEqual({ ok: 'absent' });
    expect(parseIdempotencyKey([], bounds)).toEqual({ ok: 'absent' });
  });

  it.each([
    ['empty', ''],
    ['blank', '   '],
    ['control character', 'ab\x01c'],
    ['tab inside', 'ab\tc'],
    ['two keys joined by a proxy', 'a1, b2'],
    ['unterminated sf-string', '"abc'],
    ['sf-string with parameters', '"abc";x=1'],
    ['sf-string then garbage', '"abc" d'],
    ['non-ASCII', 'clé'],
    ['a no-break space around it', '\u00a0abc'],
    ['too long', 'k'.repeat(256)],
  ])('rejects %s', (_name, header) => {
    expect(parseIdempotencyKey(header, bounds).ok).toBe(false);
  });

  it.each([
    ['as two lines', ['a', 'a']],
    ['joined, bare', 'a, b'],
    ['joined, the same key', 'OD-7f21,OD-7f21'],
    ['joined, quoted', '"a", "b"'],
  ] as const)('rejects two Idempotency-Key headers %s', (_name, header) => {
    const parsed = parseIdempotencyKey(header, bounds);
    expect(parsed).toEqual({ ok: false, reason: expect.stringContaining('more than once') });
  });

  it.each([
    ['bare', ['a,b']],
    ['bare, spaced', ['OD-7f21, OD-7f22']],
    ['an sf-list', ['"a", "b"']],
  ] as const)(
    'one Idempotency-Key line holding a comma outside quotes (%s): the comma is named, not a repeat',
    (_name, header) => {
      const parsed = parseIdempotencyKey(header, bounds);
      expect(parsed).toEqual({ ok: false, reason: expect.stringContaining('a key is one sf-string') });
      expect(parsed).toEqual({ ok: false, reason: expect.not.stringContaining('more than once') });
    },
  );

  it('a joined value holding a comma (the lines are unknown): names the comma and a repeat', () => {
    const parsed = parseIdempotencyKey('a,b', bounds);
    expect(parsed).toEqual({
      ok: false,
      reason: expect.stringContaining('a comma is only allowed inside a quoted sf-string'),
    });
    expect(parsed).toEqual({ ok: false, reason: expect.stringContaining('more than once') });
  });

  it('reads a quoted key holding a comma as one key', () => {
    expect(parseIdempotencyKey('"a, b"', bounds)).toEqual({ ok: true, key: 'a, b' });
  });

  it('honours configured bounds', () => {
    const strict = { minLength: 16, maxLength: 20 };
    expect(parseIdempotencyKey('short', strict).ok).toBe(false);
    expect(parseIdempotencyKey('exactly-sixteen!', strict).ok).toBe(true);
    expect(parseIdempotencyKey('k'.repeat(21), strict).ok).toBe(false);
  });

  it('round-trips any valid bare key', () => {
    fc.assert(
      fc.property(bareKey, (key) => {
        expect(parseIdempotencyKey(key, bounds)).toEqual({ ok: true, key });
      }),
    );
  });

  it('round-trips any valid key sent as a structured-field string', () => {
    fc.assert(
      fc.property(
        printable.filter((k) => k.length >= 1 && k.length <= 255),
        (key) => {
          expect(parseIdempotencyKey(serializeItem(key), bounds)).toEqual({ ok: true, key });
        },
      ),
    );
  });

  it('rejects any key with a character outside printable ASCII', () => {
    const outside = fc.oneof(
      fc.integer({ min: 0, max: 0x1f }),
      fc.constant(0x7f),
      fc.integer({ min: 0x80, max: 0xffff }),
    );
    fc.assert(
      // Inside the key: spaces and tabs around a header value are not part of it (RFC 9110 §5.5).
      fc.property(bareKey, outside, bareKey, (head, code, tail) => {
        const bad = head + String.fromCharCode(code) + tail;
        expect(parseIdempotencyKey(bad, bounds).ok).toBe(false);
        expect(
          parseIdempotencyKey(`"${bad.replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`, bounds).ok,
        ).toBe(false);
      }),
    );
  });

  it('rejects any key longer than the bound, bare or quoted', () => {
    fc.assert(
      fc.property(fc.string({ unit: bareChar, minLength: 256, maxLength: 400 }), (key) => {
        expect(parseIdempotencyKey(key, bounds).ok).toBe(false);
        expect(parseIdempotencyKey(serializeItem(key), bounds).ok).toBe(false);
      }),
    );
  });
});
