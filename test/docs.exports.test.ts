import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

/**
 * What an editor shows a user hovering an import: the doc comment of each public export, as the
 * built `.d.ts` of its subpath carries it. Needs `npm run build` (npm test runs it first).
 */
const root = join(import.meta.dirname, '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
  exports: Record<string, { types: string }>;
};
const entries = Object.entries(pkg.exports).map(
  ([subpath, target]) => [subpath, join(root, target.types)] as const,
);
const program = ts.createProgram(
  entries.map(([, file]) => file),
  { strict: true, module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext },
);
const checker = program.getTypeChecker();

describe('the built type declarations', () => {
  it.each(entries)('%s: every export carries a doc comment', (_subpath, file) => {
    const source = program.getSourceFile(file);
    expect(source, file).toBeDefined();
    const module = checker.getSymbolAtLocation(source!)!;
    const undocumented = checker
      .getExportsOfModule(module)
      .filter((exported) => {
        const symbol = exported.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(exported) : exported;
        return ts.displayPartsToString(symbol.getDocumentationComment(checker)).trim() === '';
      })
      .map((symbol) => symbol.name);
    expect(undocumented).toEqual([]);
  });
});
