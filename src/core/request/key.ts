import { parseItem, parseList, serializeItem } from 'structured-headers';

/** Bounds a key must fit. */
export interface KeyBounds {
  minLength: number;
  maxLength: number;
}

/** `parseIdempotencyKey`'s answer: the key, why the header is refused, or `'absent'`. */
export type ParsedKey = { ok: true; key: string } | { ok: false; reason: string } | { ok: 'absent' };

// A bare key is visible ASCII without the characters that would make it ambiguous in a header
// list: a comma (two headers joined by a proxy) or a double quote (a broken sf-string).
const BARE_KEY = /^[\x21\x23-\x2b\x2d-\x7e]+$/;
// A quoted sf-string may also hold spaces; structured-headers rejects everything else.
const PRINTABLE = /^[\x20-\x7e]*$/;

const TWICE = 'the Idempotency-Key header appears more than once';
// A key is one sf-string or one token: a comma outside quotes is either a key that may not hold
// one, or two header lines joined. One line (an adapter that sees the raw lines) is the former;
// a value joined before we see it (Web `Headers`, Fastify) may be either, so it names both.
const COMMA =
  'the Idempotency-Key holds a comma, which a key may not: a key is one sf-string ("…") or one token, and a comma is only allowed inside a quoted sf-string';
const COMMA_OR_TWICE = `${COMMA} (or the Idempotency-Key header appears more than once, its lines joined by a comma)`;
const trimOws = (value: string) => value.replace(/^[ \t]+|[ \t]+$/g, '');

/**
 * Whether `raw` is two or more header lines joined by commas, as node:http, Web `Headers` and
 * proxies join them: a list of sf-strings, or of bare keys (which hold no comma of their own).
 */
function isJoined(raw: string): boolean {
  if (!raw.includes(',')) return false;
  try {
    if (parseList(raw).length > 1) return true;
  } catch {
    // Not a structured list; it may still be bare keys, which need not be sf-tokens.
  }
  return raw.split(',').every((part) => BARE_KEY.test(trimOws(part)));
}

/**
 * `key` as an `Idempotency-Key` header value that {@link parseIdempotencyKey} reads back: bare
 * when it can be, or a quoted sf-string (always, with `sfString`: the IETF draft's form).
 */
export function keyHeaderValue(key: string, sfString: boolean): string {
  return !sfString && BARE_KEY.test(key) ? key : serializeItem(key);
}

/**
 * Reads the `Idempotency-Key` header: a quoted sf-string as the IETF draft specifies
 * (`"8e03978e-40d5"`) or a bare value as Stripe and most clients send (`OD-7f21`).
 * An array of lines (as node:http's raw headers give them) tells one line from several: more than
 * one is refused as a repeated header; a comma outside quotes in one line as a key that may not
 * hold one. A single string may be lines joined by commas, so its refusal names both causes.
 */
export function parseIdempotencyKey(
  header: string | readonly string[] | undefined,
  bounds: KeyBounds,
): ParsedKey {
  if (header === undefined) return { ok: 'absent' };
  const oneLine = typeof header !== 'string';
  if (typeof header !== 'string') {
    if (header.length === 0) return { ok: 'absent' };
    if (header.length > 1) return { ok: false, reason: TWICE };
    header = header[0] as string;
  }
  // HTTP strips only spaces and tabs around a field value; String#trim would also eat Unicode spaces.
  const raw = trimOws(header);
  if (raw === '') return { ok: false, reason: 'the Idempotency-Key header is empty' };
  if (isJoined(raw)) return { ok: false, reason: oneLine ? COMMA : COMMA_OR_TWICE };
  let key: string;
  if (raw.startsWith('"')) {
    let item: ReturnType<typeof parseItem>;
    try {
      item = parseItem(raw);
    } catch {
      return { ok: false, reason: 'the Idempotency-Key header is not a valid structured-field string' };
    }
    if (typeof item[0] !== 'string' || item[1].size > 0) {
      return { ok: false, reason: 'the Idempotency-Key header must be a single string without parameters' };
    }
    key = item[0];
    if (!PRINTABLE.test(key)) return { ok: false, reason: 'the Idempotency-Key must be printable ASCII' };
  } else {
    if (!BARE_KEY.test(raw)) {
      return {
        ok: false,
        reason:
          'the Idempotency-Key must be printable ASCII without spaces, commas or quotes (or a quoted string)',
      };
    }
    key = raw;
  }
  if (key.length < bounds.minLength || key.length > bounds.maxLength) {
    return {
      ok: false,
      reason: `the Idempotency-Key must be ${bounds.minLength} to ${bounds.maxLength} characters long`,
    };
  }
  return { ok: true, key };
}
