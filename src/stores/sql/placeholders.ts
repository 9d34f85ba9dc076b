/**
 * A statement with `:name` placeholders (as the `mysql` store's texts are written, for mysql2's
 * `namedPlaceholders`) in positional form: each `:name` becomes `?` and its value is appended to
 * `params`, so a name used twice is bound twice. Quoted strings and identifiers are left as they
 * are (a `'00:00:00'` literal holds no placeholder). A name without a value is an error, not a NULL.
 */
export function positional(
  text: string,
  values: Readonly<Record<string, unknown>>,
): { text: string; params: unknown[] } {
  const params: unknown[] = [];
  const converted = text.replace(
    /'(?:[^'\\]|\\.|'')*'|`(?:[^`]|``)*`|:([A-Za-z_]\w*)/g,
    (match, name: string | undefined) => {
      if (name === undefined) return match;
      if (!Object.hasOwn(values, name) || values[name] === undefined) {
        throw new RangeError(`positional: no value for :${name}`);
      }
      params.push(values[name]);
      return '?';
    },
  );
  return { text: converted, params };
}
