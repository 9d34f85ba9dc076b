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

  it('the demo ages a key through the clock, not by editing the key table', () => {
    const demo = readFileSync(join(examples, 'library-loans/demo.js'), 'utf8');
    expect(demo).not.toMatch(/idempotency_keys|UPDATE\s|_at_ms/);
  });

  it('the desk parses durations with the exported parser', () => {
    const config = readFileSync(join(examples, 'library-loans/config.js'), 'utf8');
    expect(config).toMatch(/\bparseDuration\b/);
    // `ms` may still format a duration for humans, never parse one.
    for (const call of config.matchAll(/\bms\(([^)]*)\)/g)) expect(call[1]).toMatch(/\{ long: true \}/);
  });

  it('the desk leaves the lease as configured: the engine bounds it by retention', () => {
    const config = readFileSync(join(examples, 'library-loans/config.js'), 'utf8');
    expect(config).not.toMatch(/Math\.min\([^)]*LEASE/);
  });
});
