/** Deeper than this a value is refused: the canonical form (`plainCanonical`) stops there too. */
export const MAX_JSON_DEPTH = 500;

export const LONE_SURROGATE = /\p{Cs}/u;

function isPlainObject(value: object): boolean {
  const prototype = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null;
}

/** `$.items[2].at` for the path of `value` under its root. */
const memberPath = (path: string, name: string) =>
  /^[A-Za-z_$][\w$]*$/.test(name) ? `${path}.${name}` : `${path}[${JSON.stringify(name)}]`;

/**
 * Why `root` would not come back from JSON as itself (`'$.at is a Date'`), or `undefined` when it
 * would: `null`, booleans, finite numbers, strings without lone surrogates, arrays without holes
 * and plain objects of those, at most {@link MAX_JSON_DEPTH} levels deep. A Date, a Map, a class
 * instance, `undefined` in an object or array, `NaN` are refused rather than written as JSON.stringify
 * would (a string, `{}`, nothing, `null`), since the value saved would not be the value returned.
 */
export function jsonProblem(root: unknown): string | undefined {
  const pending: Array<[unknown, string, number]> = [[root, '$', 1]];
  for (let next = pending.pop(); next !== undefined; next = pending.pop()) {
    const [value, path, depth] = next;
    switch (typeof value) {
      case 'boolean':
        continue;
      case 'number':
        if (Number.isFinite(value)) continue;
        return `${path} is ${value}, which JSON cannot hold`;
      case 'string':
        if (!LONE_SURROGATE.test(value)) continue;
        return `${path} holds a lone surrogate, which UTF-8 cannot hold`;
      case 'object':
        break;
      default:
        return `${path} is ${typeof value === 'undefined' ? 'undefined' : `a ${typeof value}`}, which JSON cannot hold`;
    }
    if (value === null) continue;
    if (depth > MAX_JSON_DEPTH) return `${path} is nested deeper than ${MAX_JSON_DEPTH} levels`;
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) {
        if (!(i in value)) return `${path}[${i}] is a hole, which JSON cannot hold`;
        pending.push([value[i], `${path}[${i}]`, depth + 1]);
      }
      continue;
    }
    if (!isPlainObject(value)) {
      return `${path} is a ${value.constructor?.name ?? 'object'}, not a plain object (JSON would not give it back)`;
    }
    for (const name of Object.keys(value)) {
      if (LONE_SURROGATE.test(name)) return `${memberPath(path, name)} has a lone surrogate in its name`;
      pending.push([(value as Record<string, unknown>)[name], memberPath(path, name), depth + 1]);
    }
  }
  return undefined;
}
