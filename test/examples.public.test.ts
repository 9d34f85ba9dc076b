import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

// The examples are users of the package: they import its public subpaths, Node's built-ins, the
// drivers and frameworks a user installs, and their own files. Nothing from src/ or test/.
const examples = join(import.meta.dirname, '../examples');
const files = readdirSync(examples, { recursive: true, encoding: 'utf8' })
  .filter((file) => file.endsWith('.js'))
  .map((file) => [file, readFileSync(join(examples, file), 'utf8')] as const);
const specifiers = (source: string) =>
  [...source.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*)'([^']+)'/g)].map((match) => match[1]!);

describe('the examples use only public exports', () => {
  it.each(files)('%s', (file, source) => {
    for (const specifier of specifiers(source)) {
      if (specifier.startsWith('.')) {
        expect(join('examples', file, '..', specifier), `${file} imports ${specifier}`).toMatch(
          /^examples\//,
        );
      } else {
        expect(specifier, file).not.toMatch(/^retrysafe\/(src|dist|test)\b/);
      }
    }
  });
});
