// Shared by the two services of the examples, the loan desk and the payment provider: both take a
// JSON object as a request body and answer the same 400 problems when it is none. Neither service
// imports anything of the other; each stays a process of its own.

/**
 * The JSON object `body` (a Buffer) holds, as `{ value }`, or the 400 `problem` saying why there is
 * none: `invalid_json` when it does not parse, `invalid_body` (with `notObject` as its message)
 * when it parses to something other than an object.
 */
export function parseJsonObject(body, notObject) {
  let value;
  try {
    value = JSON.parse(body.toString('utf8'));
  } catch (error) {
    return { problem: { error: 'invalid_json', message: `The body is not valid JSON: ${error.message}` } };
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return { problem: { error: 'invalid_body', message: notObject } };
  }
  return { value };
}
