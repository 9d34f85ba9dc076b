/** Each text's positional form and its placeholders' names in order, made once per text. */
const compiled = new Map<string, { text: string; names: string[] }>();

/**
 * A statement with `:name` placeholders (as the `mysql` store's texts are written) in positional
 * form: each `:name` becomes `?` and its value is appended to `params`, so a name used twice is
 * bound twice. Quoted strings and identifiers are left as they are (a `'00:00:00'` literal holds
 * no placeholder). A name without a value is an error, not a NULL.
 */
export function positional(
  text: string,
  values: Readonly<Record<string, unknown>>,
): { text: string; params: unknown[] } {
  let form = compiled.get(text);
  if (!form) {
    const names: string[] = [];
    const converted = text.replace(
      /'(?:[^'\\]|\\.|'')*'|`(?:[^`]|``)*`|:([A-Za-z_]\w*)/g,
      (match, name: string | undefined) => {
        if (name === undefined) return match;
        names.push(name);
        return '?';
      },
    );
    form = { text: converted, names };
    // The texts are the store's own, a few per table: the cache stays small.
    compiled.set(text, form);
  }
  const params = form.names.map((name) => {
    if (!Object.hasOwn(values, name) || values[name] === undefined) {
      throw new RangeError(`positional: no value for :${name}`);
    }
    return values[name];
  });
  return { text: form.text, params };
}
