import { MIMEType } from 'node:util';
import { parseJsonObject } from '../../json-object.js';
import { sendJson as send } from './respond.js';

const IDENTIFIER = /^[^\p{Cc}]{1,64}$/u;

/**
 * Whether a body is declared JSON (`application/json`, UTF-8 if a charset is named). A form or a
 * `text/plain` post from a page on another site needs no CORS preflight; refusing them (415) before
 * anything is claimed or written means such a page cannot lend a book or fine a member.
 */
export function isJsonBody(req) {
  const declared = req.headers['content-type'];
  // The types clients send, recognised without parsing: a MIMEType costs more than a replay.
  if (declared === 'application/json' || declared === 'application/json; charset=utf-8') return true;
  try {
    const type = new MIMEType(declared ?? '');
    const charset = type.params.get('charset');
    return type.essence === 'application/json' && (charset === null || charset.toLowerCase() === 'utf-8');
  } catch {
    return false;
  }
}

/** Answers 415 to a body not declared JSON; `what` names it ("the loan"). */
export const unsupportedMediaType = (res, what) =>
  send(
    res,
    415,
    {
      error: 'unsupported_media_type',
      message: `Send ${what} as JSON, with Content-Type: application/json.`,
    },
    { 'accept-post': 'application/json' },
  );

/**
 * The JSON object of a request body, or the 400 `problem` saying why there is none; `shape`
 * names its fields for the messages (`{"member", "isbn"}`).
 */
export function readJsonObject(body, shape) {
  if (body.length === 0) {
    return { problem: { error: 'invalid_body', message: `The body is empty; send ${shape}.` } };
  }
  return parseJsonObject(body, `The body must be a JSON object ${shape}.`);
}

/** The 400 problem of a field that is no id (1 to 64 characters, no control character), if it is none. */
export function identifierProblem(value, field) {
  // PostgreSQL refuses NUL in text; no id has a control character, so none reaches a database.
  if (typeof value[field] === 'string' && IDENTIFIER.test(value[field])) return undefined;
  return {
    error: 'validation',
    field,
    message: `${field} must be a string of 1 to 64 characters, none a control character.`,
  };
}
