/**
 * What `knexPlaceholders` passes through as text, and the `$n` it binds: string literals and
 * quoted identifiers (`''` and `""` escapes), dollar-quoted bodies, comments, then a placeholder
 * or a bare `?`. A `$n` inside any of the former is text, not a placeholder.
 */
const TOKENS =
  /'(?:[^']|'')*'|"(?:[^"]|"")*"|\$([A-Za-z_]\w*)?\$[\s\S]*?\$\1\$|--[^\n]*|\/\*[\s\S]*?\*\/|\$(\d+)|\?/g;

/**
 * PostgreSQL's `$n` placeholders as Knex's `?`, with the values in the order they are used (a
 * `$n` used twice is bound twice). Knex binds every `?` in a raw statement's text, even in a
 * string literal or a comment, and reads `??` as an identifier: each `?` already there (a jsonb
 * operator, a literal) is escaped as `\?`, which Knex sends as a plain `?`.
 */
export function knexPlaceholders(
  sql: string,
  params: readonly unknown[],
): { sql: string; bindings: unknown[] } {
  const bindings: unknown[] = [];
  const text = sql.replace(TOKENS, (match, _tag: string | undefined, n: string | undefined) => {
    if (n === undefined) return match.replaceAll('?', '\\?');
    const index = Number(n) - 1;
    if (index >= params.length) {
      throw new RangeError(`knexDriver: $${n} in a statement given ${params.length} values`);
    }
    bindings.push(params[index]);
    return '?';
  });
  return { sql: text, bindings };
}
