import canonicalize from 'canonicalize';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { fingerprint } from '../src/core/fingerprint.js';

const json = 'application/json';
const fp = (body: string, contentType: string | undefined = json, method = 'POST', path = '/loans') =>
  fingerprint({ method, path, contentType, body: Buffer.from(body) });

function shuffleKeys(value: unknown, seed: number): unknown {
  if (Array.isArray(value)) return value.map((v) => shuffleKeys(v, seed));
  if (value && typeof value === 'object') {
    const entries = Object.entries(value);
    const rotated = entries
      .slice(seed % (entries.length || 1))
      .concat(entries.slice(0, seed % (entries.length || 1)));
    return Object.fromEntries(rotated.reverse().map(([k, v]) => [k, shuffleKeys(v, seed + 1)]));
  }
  return value;
}

describe('fingerprint', () => {
  it('ignores key order and whitespace of JSON bodies', () => {
    expect(fp('{"member":"U-1001","isbn":"K-02"}')).toBe(fp('{ "isbn" : "K-02",\n "member": "U-1001" }'));
  });

  it('tells apart method, path, body and content kind', () => {
    const base = fp('{"a":1}');
    expect(fp('{"a":2}')).not.toBe(base);
    expect(fp('{"a":1}', json, 'PATCH')).not.toBe(base);
    expect(fp('{"a":1}', json, 'POST', '/loans?x=1')).not.toBe(base);
    expect(fp('{"a":1}', 'text/plain')).not.toBe(base);
  });

  it('hashes non-JSON and malformed JSON bodies as bytes', () => {
    expect(fp('{"a":', json)).toBe(fp('{"a":', 'text/plain'));
    expect(fp('a b')).not.toBe(fp('a  b'));
  });

  it('accepts +json media types with parameters', () => {
    expect(fp('{"b":1,"a":2}', 'application/merge-patch+json; charset=utf-8')).toBe(fp('{"a":2,"b":1}'));
  });

  it('lets a body mapper drop a volatile field', () => {
    const drop = (body: unknown) => {
      const { sentAt: _, ...rest } = body as Record<string, unknown>;
      return rest;
    };
    const at = (sentAt: string) =>
      fingerprint(
        {
          method: 'POST',
          path: '/x',
          contentType: json,
          body: Buffer.from(JSON.stringify({ a: 1, sentAt })),
        },
        drop,
      );
    expect(at('09:00')).toBe(at('09:01'));
  });

  it('is equal for any two serialisations of the same JSON value', () => {
    fc.assert(
      fc.property(fc.jsonValue(), fc.nat(), fc.integer({ min: 0, max: 4 }), (value, seed, indent) => {
        const a = JSON.stringify(value);
        const b = JSON.stringify(shuffleKeys(value, seed), null, indent);
        expect(fp(b)).toBe(fp(a));
      }),
    );
  });

  it('differs whenever the canonical JSON forms differ', () => {
    fc.assert(
      fc.property(fc.jsonValue(), fc.jsonValue(), (a, b) => {
        fc.pre(canonicalize(a) !== canonicalize(b));
        expect(fp(JSON.stringify(a))).not.toBe(fp(JSON.stringify(b)));
      }),
    );
  });
});
