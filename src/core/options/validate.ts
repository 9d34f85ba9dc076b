import { ConfigError } from '../contract/errors.js';

/**
 * The names of an options type, checked by the compiler against the type itself: a literal
 * `Record<keyof T, true>` fails to compile when it misses a name or carries one the type lacks.
 */
export function optionNames<T>(names: Record<keyof T, true>): readonly string[] {
  return Object.keys(names);
}

/**
 * Edit distance (insertions, deletions, substitutions) between two short names. Written here
 * rather than imported: option names are a few dozen characters, and `retrysafe/client` must keep
 * importing nothing a browser cannot load as a plain ES module.
 */
function distance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const substitution = previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1);
      current[j] = Math.min(previous[j]! + 1, current[j - 1]! + 1, substitution);
    }
    previous = current;
  }
  return previous[b.length]!;
}

/**
 * Throws a ConfigError for the first option `owner` does not know, suggesting the nearest known
 * name when it is a plausible typo (at most a third of the name's letters away, and at least 2).
 */
function rejectUnknownOptions(owner: string, options: object, known: readonly string[]): void {
  for (const name of Object.keys(options)) {
    if (known.includes(name)) continue;
    let nearest = '';
    let away = Number.POSITIVE_INFINITY;
    for (const candidate of known) {
      const d = distance(name.toLowerCase(), candidate.toLowerCase());
      if (d < away) [nearest, away] = [candidate, d];
    }
    const hint = away <= Math.max(2, Math.floor(name.length / 3)) ? ` Did you mean \`${nearest}\`?` : '';
    throw new ConfigError(
      `retrysafe: ${owner} has no option \`${name}\`.${hint} Its options: ${known.map((k) => `\`${k}\``).join(', ')}.`,
    );
  }
}

/** Checks that `options` is a plain object (or absent), then its names. */
export function checkOptions<T extends object>(
  owner: string,
  options: T | undefined,
  known: readonly string[],
): T {
  if (options === undefined) return {} as T;
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new ConfigError(`retrysafe: ${owner} takes an options object; got ${JSON.stringify(options)}`);
  }
  rejectUnknownOptions(owner, options, known);
  return options;
}
