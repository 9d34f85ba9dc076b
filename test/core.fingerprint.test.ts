import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { fingerprint, parsedBody } from '../src/core/request/index.js';

const json = 'application/json';
const fp = (body: string, contentType: string | undefined = json, method = 'POST', path = '/loans') =>
  fingerprint({ method, path, contentType, body: Buffer.from(body) });

/** The fingerprint as first specified: sha256 of canonicalize's form, or of the bytes in their own domain. */
function specified(text: string): string {
  let canonical: string | undefined;
  try {
    const parsed: unknown = JSON.parse(text);
    canonical = depthOf(parsed) > 500 ? undefined : canonicalize(parsed);
  } catch {
    canonical = undefined;
  }
  const hash = createHash('sha256');
  if (canonical === undefined) hash.update('\0bytes\nPOST\n/loans\n').update(Buffer.from(text));
  else hash.update(`POST\n/loans\njson\n${canonical}`);
  return hash.digest('hex');
}

function depthOf(value: unknown): number {
  if (typeof value !== 'object' || value === null) return 0;
  return 1 + Math.max(0, ...Object.values(value).map(depthOf));
}

// Keys and strings that order or escape unlike plain ASCII: array-index-like keys (which objects
// enumerate first), keys inherited names, astral characters, lone surrogates, control characters,
// quotes and backslashes.
const awkward = fc.oneof(
  fc.constantFrom(
    '__proto__',
    'constructor',
    'toString',
    '0',
    '9',
    '10',
    '-1',
    'a',
    'B',
    'é',
    '😀',
    '\ud800',
    '\u001f',
    'say "hi"',
    'C:\\temp',
    '',
  ),
  fc.string({ unit: 'binary', maxLength: 6 }),
);
const awkwardJson = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small' },
    fc.constant(null),
    fc.boolean(),
    fc.double({ noNaN: true, noDefaultInfinity: true }),
    fc.integer(),
    awkward,
    fc.array(tie('value'), { maxLength: 4 }),
    fc.dictionary(awkward, tie('value'), { maxKeys: 5 }),
  ),
})).value;

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

  it('is the specified hash for every JSON text, whatever its keys and strings hold', () => {
    fc.assert(
      fc.property(awkwardJson, fc.nat(), fc.integer({ min: 0, max: 2 }), (value, seed, indent) => {
        // JSON.stringify drops a "__proto__" own key on its way out; the text keeps it.
        const text = JSON.stringify(shuffleKeys(value, seed), null, indent);
        expect(fp(text)).toBe(specified(text));
      }),
      { numRuns: 500 },
    );
    const nested = (levels: number, inner: string) =>
      `${'[{"b":1,"a":'.repeat(levels)}${inner}${'}]'.repeat(levels)}`;
    for (const text of [
      '{"__proto__":{"a":1},"b":{}}',
      '{"b":1,"a":{"10":1,"9":2,"__proto__":3}}',
      '[1e400]',
      '{"a":"\\ud800"}',
      '{"\\udc00":1}',
      '{"😀":1,"\\ud83d\\ude00":2,"ｚ":3}',
      nested(249, '1'),
      nested(250, '1'),
      nested(251, '1'),
      nested(200, '1e400'),
    ]) {
      expect(fp(text)).toBe(specified(text));
    }
  });

  it('hashes non-JSON and malformed JSON bodies as bytes', () => {
    expect(fp('{"a":', json)).toBe(fp('{"a":', 'text/plain'));
    expect(fp('a b')).not.toBe(fp('a  b'));
  });

  it('keeps the byte domain apart from the canonical JSON one, even for a path with a line break', () => {
    // Before the domains were separated, both hashed "POST\n/x\nbytes\njson\n{"a":1}".
    expect(fp('json\n{"a":1}', 'text/plain', 'POST', '/x')).not.toBe(
      fp('{"a":1}', json, 'POST', '/x\nbytes'),
    );
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        const text = canonicalize(value)!;
        expect(fp(text, 'text/plain')).not.toBe(fp(text));
      }),
    );
  });

  it('hashes JSON that has no canonical form (1e400, a lone surrogate, deep nesting) as bytes', () => {
    const deep = `${'['.repeat(200_000)}${']'.repeat(200_000)}`;
    for (const body of ['{"n":1e400}', '["\\ud800"]', deep]) {
      expect(fp(body)).toBe(fp(body, 'text/plain'));
      expect(fp(body)).not.toBe(fp(` ${body}`));
    }
    const nested = (levels: number) => `${'['.repeat(levels)}${']'.repeat(levels)}`;
    expect(fp(nested(500))).toBe(fp(` ${nested(500)}`));
    expect(fp(nested(501))).not.toBe(fp(` ${nested(501)}`));
  });

  it('hashes JSON that is not UTF-8 as bytes, so two different bodies never share a fingerprint', () => {
    const latin1 = (text: string) =>
      fingerprint({ method: 'POST', path: '/loans', contentType: json, body: Buffer.from(text, 'latin1') });
    // Both decode to "\ufffd" when invalid bytes are replaced.
    expect(latin1('{"a":"\xff"}')).not.toBe(latin1('{"a":"\xfe"}'));
    expect(latin1('\xef\xbb\xbf{"a":1}')).not.toBe(fp('{"a":1}'));
  });

  it('lets a body mapper that throws fall back to the bytes', () => {
    const at = (body: string) =>
      fingerprint({ method: 'POST', path: '/x', contentType: json, body: Buffer.from(body) }, (parsed) => {
        const { sentAt: _, ...rest } = parsed as { sentAt?: string };
        return rest;
      });
    expect(at('null')).toBe(fp('null', 'text/plain', 'POST', '/x'));
  });

  it('reads an absolute-form target as its path and query', () => {
    const body = '{"a":1}';
    expect(fp(body, json, 'POST', 'http://127.0.0.1:8483/loans')).toBe(fp(body));
    expect(fp(body, json, 'POST', 'HTTPS://user@desk.example/loans?x=1')).toBe(
      fp(body, json, 'POST', '/loans?x=1'),
    );
    expect(fp(body, json, 'POST', 'http://desk.example')).toBe(fp(body, json, 'POST', '/'));
    expect(fp(body, json, 'POST', 'http://desk.example?x=1')).toBe(fp(body, json, 'POST', '/?x=1'));
    // Origin-form paths are taken as sent: a router may route these apart.
    expect(fp(body, json, 'POST', '//desk.example/loans')).not.toBe(fp(body));
    expect(fp(body, json, 'POST', '/a/../loans')).not.toBe(fp(body));
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

describe('fingerprint of a body a parser already parsed', () => {
  const parsed = (value: unknown, contentType: string | undefined = json) =>
    fingerprint({ method: 'POST', path: '/loans', contentType, body: parsedBody(value) });

  /** What JSON.parse can make, plus NaN; a few names and leaves, so that near twins are common. */
  const special = fc.constantFrom(null, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, Number.NaN);
  const parsedValue = fc.letrec((tie) => ({
    value: fc.oneof(
      { depthSize: 'small' },
      special,
      fc.constantFrom(0, -0, 1, true, 'a', 'null', 'Infinity', '\ud800'),
      fc.array(tie('value'), { maxLength: 3 }),
      fc.dictionary(fc.constantFrom('a', 'b', 'null'), tie('value'), { maxKeys: 2 }),
    ),
  })).value;

  /** Structural equality, key order aside, with Infinity, -Infinity, NaN and null all distinct. */
  function same(a: unknown, b: unknown): boolean {
    if (typeof a === 'number' && typeof b === 'number')
      return a === b || (Number.isNaN(a) && Number.isNaN(b));
    if (Array.isArray(a) || Array.isArray(b)) {
      return (
        Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => same(x, b[i]))
      );
    }
    if (typeof a === 'object' && a !== null && typeof b === 'object' && b !== null) {
      const keys = Object.keys(a);
      return (
        keys.length === Object.keys(b).length &&
        keys.every((k) => Object.hasOwn(b, k) && same((a as never)[k], (b as never)[k]))
      );
    }
    return a === b;
  }

  it('differs whenever the parsed values differ, Infinity, -Infinity, NaN and null included', () => {
    fc.assert(
      fc.property(parsedValue, parsedValue, (a, b) => {
        fc.pre(!same(a, b));
        expect(parsed(a)).not.toBe(parsed(b));
      }),
      { numRuns: 2000 },
    );
    expect(parsed({ n: Number.POSITIVE_INFINITY })).not.toBe(parsed({ n: null }));
    expect(parsed([Number.NaN])).not.toBe(parsed([Number.NEGATIVE_INFINITY]));
  });

  it('is the same for the same request: the same value, or a copy of it', () => {
    fc.assert(
      fc.property(parsedValue, (value) => {
        expect(parsed(structuredClone(value))).toBe(parsed(value));
      }),
    );
    const body = JSON.parse('{"n":1e400,"m":[-1e400]}');
    expect(parsed(body)).toBe(parsed(JSON.parse('{"n":2e400,"m":[-3e999]}')));
  });

  it('is unchanged for a value JSON writes exactly: the fingerprint of the JSON text', () => {
    fc.assert(
      fc.property(
        awkwardJson,
        fc.constantFrom(json, 'application/problem+json; charset=utf-8'),
        (value, type) => {
          // A string a text parser made is the body as sent, and null no body: those are not written.
          fc.pre(typeof value !== 'string' && value !== null);
          expect(parsed(value, type)).toBe(fp(JSON.stringify(value), type));
        },
      ),
      { numRuns: 500 },
    );
  });

  it('keeps the values JSON cannot write apart from raw bodies and from the canonical domain', () => {
    const infinite = parsed({ n: Number.POSITIVE_INFINITY });
    for (const text of ['{"n":Infinity}', '{"n":1e400}', '{"n":null}']) {
      expect(infinite).not.toBe(fp(text));
      expect(infinite).not.toBe(fp(text, 'text/plain'));
    }
  });

  it('-0 is 0 (RFC 8785 writes both as 0), and an undefined member is no member; an undefined item is not null', () => {
    expect(parsed({ n: -0 })).toBe(parsed({ n: 0 }));
    expect(parsed({ a: 1, b: undefined })).toBe(parsed({ a: 1 }));
    expect(parsed([undefined])).not.toBe(parsed([null]));
  });

  it('writes a body nested past the stack, exact or not', () => {
    const deep = (inner: unknown) => {
      let value = inner;
      for (let i = 0; i < 200_000; i++) value = [value];
      return value;
    };
    const text = `${'['.repeat(200_000)}1${']'.repeat(200_000)}`;
    expect(parsed(deep(1))).toBe(fp(text));
    expect(parsed(deep(Number.POSITIVE_INFINITY))).not.toBe(parsed(deep(null)));
  });
});

describe('fingerprint of a form, and of a parsed value of another media type', () => {
  const form = 'application/x-www-form-urlencoded';
  const parsed = (value: unknown, contentType: string | undefined) =>
    fingerprint({ method: 'POST', path: '/loans', contentType, body: parsedBody(value) });
  const field = fc.tuple(fc.constantFrom('item', 'qty', 'a%62', 'ab', ''), fc.string({ maxLength: 3 }));
  const fields = fc.uniqueArray(field, { selector: ([name]) => name, maxLength: 5 });
  const written = (pairs: Array<[string, string]>) => pairs.map(([n, v]) => `${n}=${encodeURIComponent(v)}`);

  it('a form sent as bytes: any order of its fields is one fingerprint; another value, another', () => {
    fc.assert(
      fc.property(fields, fc.nat(), (pairs, seed) => {
        const sent = written(pairs);
        const shuffled = [...sent].sort(
          (a, b) => ((a.length * 31 + seed) % 7) - ((b.length * 31 + seed) % 7),
        );
        expect(fp(shuffled.join('&'), form)).toBe(fp(sent.join('&'), form));
        expect(fp(`${sent.join('&')}&x=1`, form)).not.toBe(fp(sent.join('&'), form));
      }),
    );
    // A repeated field's values keep their order; names are compared as sent.
    expect(fp('a=1&a=2', form)).not.toBe(fp('a=2&a=1', form));
    expect(fp('a%62=1', form)).not.toBe(fp('ab=1', form));
  });

  it('a parsed form: any order of its fields is one fingerprint', () => {
    fc.assert(
      fc.property(fields, (pairs) => {
        const value = Object.fromEntries(pairs);
        expect(parsed(Object.fromEntries([...pairs].reverse()), form)).toBe(parsed(value, form));
      }),
    );
  });

  it('different media types never share a fingerprint, parsed or as bytes', () => {
    const types = [form, json, 'text/plain', 'application/octet-stream', undefined];
    fc.assert(
      fc.property(fields, (pairs) => {
        const value = Object.fromEntries(pairs);
        const text = JSON.stringify(value);
        const seen = new Set([
          ...types.map((type) => parsed(value, type)),
          fp(text, 'text/plain'),
          fp(written(pairs).join('&'), form),
        ]);
        expect(seen.size).toBe(types.length + 2);
        // Parsed JSON is the JSON sent, as before.
        expect(parsed(value, json)).toBe(fp(text, json));
      }),
    );
    // The media type is compared without its parameters and case.
    expect(parsed({ a: '1' }, 'Text/Plain; charset=utf-8')).toBe(parsed({ a: '1' }, 'text/plain'));
  });
});
