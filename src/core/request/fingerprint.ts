import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { sha256 } from './sha256.js';

/** The parts of a request that decide whether a retry is the same request. */
export interface FingerprintInput {
  method: string;
  /** The request target as the client sent it: path and query, or absolute-form (`http://host/path`). */
  path: string;
  contentType: string | undefined;
  body: RequestBody;
}

/**
 * A request body as an adapter hands it over: its bytes, or for a body a parser already turned into
 * a value, what {@link parsedBody} writes of that value.
 */
export type RequestBody = Uint8Array | ParsedBody;

/**
 * A value a parser made of the body (of the request's media type), as {@link parsedBody} wrote it:
 * its JSON text, or, for a value JSON cannot write (`Infinity`, `NaN`, an `undefined` array item),
 * that text with those written as themselves (`exact: false`).
 */
export interface ParsedBody {
  readonly parsed: Uint8Array;
  readonly exact: boolean;
}

/** Maps a parsed JSON body before it is hashed, e.g. to drop a volatile field. */
export type FingerprintBody = (body: unknown) => unknown;

const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;
const FORM_TYPE = /^application\/x-www-form-urlencoded\s*(?:;|$)/i;

// An absolute-form target (RFC 9112 §3.2.2), as sent to proxies and accepted by origin servers.
const SCHEME_AND_AUTHORITY = /^[a-z][a-z\d+.-]*:\/\/[^/?#]*/i;

/**
 * JSON nested deeper than this is hashed as bytes. canonicalize recurses once per level and runs
 * out of stack near 1,800 levels from an empty stack, fewer under a deep framework stack; a fixed
 * bound, well below that, decides the same way for the same body wherever it is called from.
 */
const MAX_CANONICAL_DEPTH = 500;

// JSON is UTF-8 (RFC 8259 §8.1): replacing bad bytes with U+FFFD would make different bodies one
// value, and a kept BOM makes JSON.parse refuse the body as the handler's parser would.
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * sha256 over method, path and body. A JSON body, as bytes or parsed, is hashed in its RFC 8785
 * canonical form, so key order and whitespace do not make two equal requests differ; so is a
 * value a parser made of any other media type, in a domain that names that type, so that a body of
 * another type never shares its fingerprint. A form body read as bytes is hashed with its fields
 * in order of name (a field repeated keeps its values' order); any other body is hashed as bytes,
 * and so is JSON that has no canonical form (`1e400`, a lone surrogate, nesting past 500 levels).
 */
export function fingerprint(input: FingerprintInput, mapBody?: FingerprintBody): string {
  const head = `${input.method.toUpperCase()}\n${originForm(input.path)}\n`;
  const { body, contentType } = input;
  const isJson = contentType !== undefined && JSON_TYPE.test(contentType);
  // The byte and parsed domains start with a NUL, which no method (an HTTP token) contains, so
  // neither collides with the canonical JSON one, whatever the path holds.
  if (body instanceof Uint8Array) {
    const canonical = isJson ? canonicalJson(body, mapBody) : undefined;
    if (canonical !== undefined) return sha256(`${head}json\n${canonical}`, 'hex');
    if (contentType !== undefined && FORM_TYPE.test(contentType)) {
      return sha256(`\0form\n${head}${fieldsByName(body)}`, 'hex');
    }
    return createHash('sha256').update(`\0bytes\n${head}`).update(body).digest('hex');
  }
  if (isJson) {
    // Parsed JSON: the text JSON.stringify wrote hashes as the bytes sent would (no other pass).
    if (body.exact) return fingerprint({ ...input, body: body.parsed }, mapBody);
    return createHash('sha256').update(`\0parsed\n${head}`).update(body.parsed).digest('hex');
  }
  // Canonical text is JSON, inexact text is not (a bare Infinity, NaN or undefined): apart. The
  // space after `parsed` keeps even a missing media type apart from the JSON domain above.
  const canonical = body.exact ? canonicalJson(body.parsed) : undefined;
  return createHash('sha256')
    .update(`\0parsed ${mediaType(contentType)}\n${head}`)
    .update(canonical ?? body.parsed)
    .digest('hex');
}

/** `Text/Plain; charset=utf-8` → `text/plain`; none → the empty string. */
function mediaType(contentType: string | undefined): string {
  if (contentType === undefined) return '';
  const end = contentType.indexOf(';');
  return (end === -1 ? contentType : contentType.slice(0, end)).trim().toLowerCase();
}

/**
 * `qty=2&item=book` → `item=book&qty=2`: fields ordered by name as sent (still percent-encoded,
 * so no two different fields become one), a repeated field's values in the order sent.
 */
function fieldsByName(body: Uint8Array): string {
  // latin1 maps each byte to one code unit: lossless, whatever the bytes.
  const fields = Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('latin1').split('&');
  const nameOf = (field: string) => {
    const end = field.indexOf('=');
    return end === -1 ? field : field.slice(0, end);
  };
  // Array.prototype.sort is stable: equal names keep their order.
  return fields
    .map((field) => [nameOf(field), field] as const)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([, field]) => field)
    .join('&');
}

/**
 * What to fingerprint for a body a parser already consumed (`express.json()`,
 * `express.urlencoded()`, Nest's parsers, a Koa parser without `rawBody`): the value written back
 * as JSON, which a JSON body then hashes as the bytes sent would, and a value of another media type
 * (a parsed form) canonically, in that type's domain. A string or bytes (`express.text()`,
 * `express.raw()`) are the body's bytes. A value JSON cannot write exactly is written with `Infinity`,
 * `-Infinity`, `NaN` and `undefined` where JSON.stringify writes `null`, so `{"n":1e400}`, which
 * JSON.parse reads as Infinity, never shares a fingerprint with `{"n":null}`. Two values the
 * handler cannot tell apart by `===` share one: `-0` and `0` (RFC 8785 writes both `0`), and a
 * member holding `undefined` and no member at all.
 */
export function parsedBody(value: unknown): RequestBody {
  if (value === undefined || value === null) return new Uint8Array(0);
  if (value instanceof Uint8Array) return value;
  if (typeof value === 'string') return Buffer.from(value, 'utf8');
  let text: string;
  try {
    text = JSON.stringify(value);
  } catch (error) {
    // JSON.parse nests without limit but JSON.stringify recurses: a body nested deeper than the
    // stack is still a request to fingerprint, not a 500.
    if (!(error instanceof RangeError)) throw error;
    return written(value);
  }
  // JSON.stringify writes every value it cannot write as `null`: without one, the text is exact.
  if (text.includes('null') && !writesExactly(value)) return written(value);
  return { parsed: Buffer.from(text, 'utf8'), exact: true };
}

/** `false` when the value holds a non-finite number or an `undefined` array item. */
function writesExactly(root: unknown): boolean {
  const pending: unknown[] = [root];
  while (pending.length > 0) {
    const value = pending.pop();
    if (typeof value === 'number' && !Number.isFinite(value)) return false;
    if (typeof value !== 'object' || value === null) continue;
    if (Array.isArray(value)) {
      for (const item of value) {
        if (item === undefined) return false;
        pending.push(item);
      }
    } else for (const item of Object.values(value)) pending.push(item);
  }
  return true;
}

/**
 * JSON.stringify's text, written with an explicit stack instead of recursion, and with the values
 * it writes as `null` written as themselves, `exact` or not.
 */
function written(root: unknown): ParsedBody {
  let exact = true;
  const out: string[] = [];
  // Values still to write, and the punctuation between them, in reverse order.
  const todo: Array<{ value: unknown } | string> = [{ value: root }];
  for (let next = todo.pop(); next !== undefined; next = todo.pop()) {
    if (typeof next === 'string') {
      out.push(next);
      continue;
    }
    let { value } = next;
    if (typeof (value as { toJSON?: unknown } | null)?.toJSON === 'function') {
      value = (value as { toJSON(): unknown }).toJSON();
    }
    if (Array.isArray(value)) {
      todo.push(']');
      for (let i = value.length - 1; i >= 0; i--) todo.push({ value: value[i] }, i > 0 ? ',' : '');
      todo.push('[');
    } else if (typeof value === 'object' && value !== null) {
      // JSON.stringify leaves out the members it cannot write.
      const entries = Object.entries(value).filter(
        ([, v]) => v !== undefined && typeof v !== 'function' && typeof v !== 'symbol',
      );
      todo.push('}');
      for (let i = entries.length - 1; i >= 0; i--) {
        const [name, v] = entries[i]!;
        todo.push({ value: v }, `${i > 0 ? ',' : ''}${JSON.stringify(name)}:`);
      }
      todo.push('{');
    } else if (value === undefined || (typeof value === 'number' && !Number.isFinite(value))) {
      exact = false;
      out.push(String(value));
    } else out.push(JSON.stringify(value) ?? 'null');
  }
  return { parsed: Buffer.from(out.join(''), 'utf8'), exact };
}

/** `http://host/loans?x=1` → `/loans?x=1`; origin-form is kept as sent, since routers see it so. */
function originForm(target: string): string {
  const authority = SCHEME_AND_AUTHORITY.exec(target);
  if (authority === null) return target;
  const rest = target.slice(authority[0].length);
  return rest.startsWith('/') ? rest : `/${rest}`;
}

function canonicalJson(body: Uint8Array, mapBody?: FingerprintBody): string | undefined {
  try {
    const parsed: unknown = JSON.parse(UTF8.decode(body));
    if (mapBody === undefined) {
      const plain = plainCanonical(parsed, 1);
      if (plain !== undefined) return plain;
    }
    // Each level takes two bytes, so a body this short cannot be too deep.
    if (body.byteLength > 2 * MAX_CANONICAL_DEPTH && deeperThan(parsed, MAX_CANONICAL_DEPTH)) {
      return undefined;
    }
    return canonicalize(mapBody ? mapBody(parsed) : parsed);
  } catch {
    // Not UTF-8 JSON after all, JSON with no RFC 8785 form, or a body the mapper refuses: the
    // bytes are the request, and the handler answers what it makes of them.
    return undefined;
  }
}

// In a u-mode pattern a surrogate pair reads as one code point, so only a lone surrogate matches.
const LONE_SURROGATE = /\p{Cs}/u;

// What JSON.stringify writes as it is between quotes: no quote, backslash or control character,
// and no surrogate (this pattern reads code units, so a pair matches too, and takes the long way).
// biome-ignore lint/suspicious/noControlCharactersInRegex: the control characters JSON escapes.
const VERBATIM = /^[^"\\\u0000-\u001f\ud800-\udfff]*$/;

/**
 * JSON.stringify's text of a string, `undefined` for one with a lone surrogate. Most keys and
 * values need no escape: quoting them costs a pattern test, a call to JSON.stringify several times
 * that, and a body has a few of each.
 */
function jsonString(value: string): string | undefined {
  if (VERBATIM.test(value)) return `"${value}"`;
  return LONE_SURROGATE.test(value) ? undefined : JSON.stringify(value);
}

/**
 * What `canonicalize` returns for a parsed body made of finite numbers, strings and keys without
 * lone surrogates, and at most MAX_CANONICAL_DEPTH levels, written the same way (each object's
 * `Object.keys` sorted, every key and primitive as JSON.stringify writes it) without its per-value
 * checks and closures; `undefined` for anything else, which then takes the general path.
 */
export function plainCanonical(value: unknown, depth = 1): string | undefined {
  if (typeof value !== 'object' || value === null) {
    if (typeof value === 'string') return jsonString(value);
    if (typeof value === 'number') return Number.isFinite(value) ? `${value}` : undefined;
    return JSON.stringify(value);
  }
  if (depth > MAX_CANONICAL_DEPTH) return undefined;
  let text: string;
  if (Array.isArray(value)) {
    text = '[';
    for (let i = 0; i < value.length; i++) {
      const item = plainCanonical(value[i], depth + 1);
      if (item === undefined) return undefined;
      text += i === 0 ? item : `,${item}`;
    }
    return `${text}]`;
  }
  const keys = Object.keys(value).sort();
  text = '{';
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i] as string;
    const name = jsonString(key);
    const item = plainCanonical((value as Record<string, unknown>)[key], depth + 1);
    if (item === undefined || name === undefined) return undefined;
    text += `${i === 0 ? '' : ','}${name}:${item}`;
  }
  return `${text}}`;
}

function deeperThan(value: unknown, limit: number): boolean {
  const pending: Array<[object, number]> = [];
  if (typeof value === 'object' && value !== null) pending.push([value, 1]);
  for (let next = pending.pop(); next !== undefined; next = pending.pop()) {
    const [node, depth] = next;
    if (depth > limit) return true;
    for (const child of Object.values(node)) {
      if (typeof child === 'object' && child !== null) pending.push([child, depth + 1]);
    }
  }
  return false;
}
