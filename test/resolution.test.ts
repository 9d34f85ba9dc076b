import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// A project next to the package, as a user's would be after `npm install retrysafe`: its
// node_modules/retrysafe is this repository (built dist/ and package.json as shipped).
const root = join(import.meta.dirname, '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
  exports: Record<string, unknown>;
};
const subpaths = Object.keys(pkg.exports).map((entry) => entry.replace(/^\./, 'retrysafe'));
let project: string;

beforeAll(() => {
  project = mkdtempSync(join(tmpdir(), 'retrysafe-resolution-'));
  mkdirSync(join(project, 'node_modules'));
  symlinkSync(root, join(project, 'node_modules', 'retrysafe'), 'dir');
});
afterAll(() => rmSync(project, { recursive: true, force: true }));

describe('CommonJS', () => {
  it.each(subpaths)("require('%s') loads the ES module (Node >= 20.19 requires ESM)", (subpath) => {
    writeFileSync(
      join(project, 'load.cjs'),
      `console.log(Object.keys(require(${JSON.stringify(subpath)})).length);`,
    );
    const out = execFileSync(process.execPath, ['load.cjs'], {
      cwd: project,
      encoding: 'utf8',
      timeout: 20_000,
    });
    expect(Number(out.trim())).toBeGreaterThan(0);
  });
});

describe('TypeScript resolves every subpath', () => {
  // node16/nodenext read `exports` from an ES module file (.mts); a CommonJS TypeScript project
  // is covered by the packed-tarball test.
  const settings: Record<string, { module: string; file: string }> = {
    node10: { module: 'commonjs', file: 'index.ts' },
    node16: { module: 'node16', file: 'index.mts' },
    nodenext: { module: 'nodenext', file: 'index.mts' },
    bundler: { module: 'esnext', file: 'index.ts' },
  };
  it.each(Object.keys(settings))('moduleResolution %s', { timeout: 60_000 }, (name) => {
    const { module, file } = settings[name]!;
    const dir = join(project, name);
    mkdirSync(dir, { recursive: true });
    const lines = subpaths.map((subpath, i) => `import type * as m${i} from ${JSON.stringify(subpath)};`);
    lines.push(`export type All = [${subpaths.map((_, i) => `keyof typeof m${i}`).join(', ')}];`);
    writeFileSync(join(dir, file), `${lines.join('\n')}\n`);
    writeFileSync(
      join(dir, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          module,
          moduleResolution: name,
          strict: true,
          noEmit: true,
          skipLibCheck: true,
          types: ['node'],
          typeRoots: [join(root, 'node_modules/@types')],
        },
        files: [file],
      }),
    );
    const tsc = join(root, 'node_modules/typescript/bin/tsc');
    let output = '';
    try {
      execFileSync(process.execPath, [tsc, '-p', dir], { cwd: dir, encoding: 'utf8', timeout: 60_000 });
    } catch (error) {
      output = String((error as { stdout?: string }).stdout);
    }
    expect(output).toBe('');
  });
});
