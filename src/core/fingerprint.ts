import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { sha256 } from './sha256.js';

/** The parts of a request that decide whether a retry is the same request. */
export interface FingerprintInput {
  method: string;
  /** The request target as the client sent it: path and query, or absolute-form (`http://host/path`). */
  path: string;
  contentType: string | undefined;
  body: Uint8Array;
}

/** Maps a parsed JSON body before it is hashed, e.g. to drop a volatile field. */
export type FingerprintBody = (body: unknown) => unknown;

const JSON_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

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
 * sha256 over method, path and body. A JSON body is hashed in its RFC 8785 canonical form, so key
 * order and whitespace do not make two equal requests differ; any other body is hashed as bytes,
 * and so is JSON that has no canonical form (`1e400`, a lone surrogate, nesting past 500 levels).
 */
export function fingerprint(input: FingerprintInput, mapBody?: FingerprintBody): string {
  const head = `${input.method.toUpperCase()}\n${originForm(input.path)}\n`;
  const canonical =
    input.contentType && JSON_TYPE.test(input.contentType) ? canonicalJson(input.body, mapBody) : undefined;
  if (canonical !== undefined) return sha256(`${head}json\n${canonical}`, 'hex');
  // The byte domain starts with a NUL, which no method (an HTTP token) contains, so a body hashed
  // as bytes never collides with a canonical one, whatever the path holds.
  return createHash('sha256').update(`\0bytes\n${head}`).update(input.body).digest('hex');
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

/**
 * What `canonicalize` returns for a parsed body made of finite numbers, strings and keys without
 * lone surrogates, and at most MAX_CANONICAL_DEPTH levels, written the same way (each object's
 * `Object.keys` sorted, every key and primitive by JSON.stringify) without its per-value checks
 * and closures; `undefined` for anything else, which then takes the general path.
 */
function plainCanonical(value: unknown, depth: number): string | undefined {
  if (typeof value !== 'object' || value === null) {
    if (
      typeof value === 'string'
        ? LONE_SURROGATE.test(value)
        : typeof value === 'number' && !Number.isFinite(value)
    ) {
      return undefined;
    }
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
    const item = plainCanonical((value as Record<string, unknown>)[key], depth + 1);
    if (item === undefined || LONE_SURROGATE.test(key)) return undefined;
    text += `${i === 0 ? '' : ','}${JSON.stringify(key)}:${item}`;
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
