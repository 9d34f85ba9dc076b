export type StatementKind = 'select' | 'returning' | 'count';
const kinds = new Map<string, StatementKind>();

/**
 * What a statement answers, by its main statement (after any `WITH` list): rows of a `SELECT`,
 * `VALUES`, `TABLE`, `SHOW` or `PRAGMA`; rows of a write's own `RETURNING`; or only a count. For
 * clients with one call for rows and another for counts (Prisma's raw calls, node-sqlite3's `all`
 * and `run`). Remembered per text: a store runs a few dozen texts.
 */
export function statementKind(sql: string): StatementKind {
  let kind = kinds.get(sql);
  if (kind === undefined) {
    const main = mainStatement(sql);
    kind = /^(select|values|table|show|pragma)\b/i.test(main)
      ? 'select'
      : /\breturning\b/i.test(main)
        ? 'returning'
        : 'count';
    if (kinds.size < 1000) kinds.set(sql, kind);
  }
  return kind;
}

/** The statement after a leading `WITH name AS (…), …` list (strings and nested parentheses skipped). */
function mainStatement(sql: string): string {
  const text = sql.trimStart();
  if (!/^with\b/i.test(text)) return text;
  let depth = 0;
  let i = 4;
  while (i < text.length) {
    const c = text[i]!;
    if (c === "'" || c === '"') {
      const end = text.indexOf(c, i + 1);
      i = end < 0 ? text.length : end + 1;
      continue;
    }
    if (c === '(') depth++;
    else if (c === ')') depth--;
    else if (depth === 0 && /[a-z]/i.test(c) && /\W/.test(text[i - 1]!)) {
      const word = /^[a-z_]+/i.exec(text.slice(i))![0].toLowerCase();
      if (['select', 'insert', 'update', 'delete', 'values', 'table', 'merge'].includes(word)) {
        return text.slice(i);
      }
      i += word.length;
      continue;
    }
    i++;
  }
  return text;
}
