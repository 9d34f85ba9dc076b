import { parseItem } from 'structured-headers';

/** Bounds a key must fit. */
export interface KeyBounds {
  minLength: number;
  maxLength: number;
}

export type ParsedKey = { ok: true; key: string } | { ok: false; reason: string } | { ok: 'absent' };

// A bare key is visible ASCII without the characters that would make it ambiguous in a header
// list: a comma (two headers joined by a proxy) or a double quote (a broken sf-string).
const BARE_KEY = /^[\x21\x23-\x2b\x2d-\x7e]+$/;
// A quoted sf-string may also hold spaces; structured-headers rejects everything else.
const PRINTABLE = /^[\x20-\x7e]*$/;

/**
 * Reads the `Idempotency-Key` header: a quoted sf-string as the IETF draft specifies
 * (`"8e03978e-40d5"`) or a bare value as Stripe and most clients send (`OD-7f21`).
 * An array means the header appeared more than once, which is always an error.
 */
export function parseIdempotencyKey(
  header: string | readonly string[] | undefined,
  bounds: KeyBounds,
): ParsedKey {
  if (header === undefined) return { ok: 'absent' };
  if (typeof header !== 'string') {
    if (header.length === 0) return { ok: 'absent' };
    if (header.length > 1) return { ok: false, reason: 'the Idempotency-Key header appears more than once' };
    header = header[0] as string;
  }
  // HTTP strips only spaces and tabs around a field value; String#trim would also eat Unicode spaces.
  const raw = header.replace(/^[ \t]+|[ \t]+$/g, '');
  if (raw === '') return { ok: false, reason: 'the Idempotency-Key header is empty' };
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
