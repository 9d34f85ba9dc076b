import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ResponseCollector } from '../src/core/response/index.js';

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (body: Uint8Array) => new TextDecoder().decode(body);

describe('ResponseCollector', () => {
  it('keeps a body within the limit whole, whatever its chunking', () => {
    fc.assert(
      fc.property(fc.array(fc.string({ maxLength: 8 }), { maxLength: 8 }), (parts) => {
        const collector = new ResponseCollector(64, 'stream', []);
        for (const part of parts) expect(collector.add(bytes(part))).toBe('keep');
        const response = collector.response(201, () => undefined);
        expect(text(response.body)).toBe(parts.join(''));
        expect(response.complete).toBe(true);
      }),
    );
  });

  it('in lease mode, past the limit hands over what was kept, the overflowing chunk included', () => {
    const collector = new ResponseCollector(4, 'stream', []);
    expect(collector.add(bytes('abc'))).toBe('keep');
    expect(collector.add(bytes('def'))).toBe('stream');
    expect(collector.take().map(text)).toEqual(['abc', 'def']);
    const response = collector.response(200, () => undefined);
    expect(response).toMatchObject({ complete: false, body: new Uint8Array(0) });
  });

  it('in atomic mode, past the limit drops the body', () => {
    const collector = new ResponseCollector(4, 'drop', []);
    collector.add(bytes('abc'));
    expect(collector.add(bytes('def'))).toBe('drop');
    expect(collector.add(bytes('g'))).toBe('drop');
    expect(collector.take()).toEqual([]);
    expect(collector.response(200, () => undefined)).toMatchObject({
      complete: false,
      body: new Uint8Array(0),
    });
  });

  it('reads only the stored headers, lists joined and numbers as text', () => {
    const set: Record<string, string | number | string[]> = {
      'content-type': 'text/plain',
      'content-length': 3,
      link: ['<a>; rel=x', '<b>; rel=y'],
      'set-cookie': ['s=1'],
    };
    const collector = new ResponseCollector(64, 'stream', ['content-type', 'content-length', 'link', 'etag']);
    expect(collector.response(200, (name) => set[name]).headers).toEqual({
      'content-type': 'text/plain',
      'content-length': '3',
      link: '<a>; rel=x, <b>; rel=y',
    });
  });
});
