import { execFileSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, relative } from 'node:path';

/**
 * Vitest globalSetup: builds dist/ once, before any test file runs, when it is missing or older
 * than src/. Examples and child processes import `retrysafe/*`, which resolves to dist/; building
 * here rather than in a test file means no suite rebuilds dist/ from under another one.
 */
const root = join(import.meta.dirname, '../..');
const src = join(root, 'src');

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts') ? [path] : [];
  });
}

function staleOutputs(): string[] {
  return sources(src).filter((file) => {
    const built = join(root, 'dist', relative(src, file).replace(/\.ts$/, '.js'));
    try {
      return statSync(built).mtimeMs < statSync(file).mtimeMs;
    } catch {
      return true;
    }
  });
}

/**
 * The Prisma clients the tests import, none committed: the quick start's
 * (examples/orm/prisma/generated, made as `npm run build` makes it) and the tests' MySQL and SQLite
 * ones (test/fixtures/prisma/<provider>/generated), each made when missing or older than its
 * schema. Generating them here, once, keeps two suites from generating them over one another.
 */
function generatePrismaClients(): void {
  const schemas = ['examples/orm/prisma', 'test/fixtures/prisma/mysql', 'test/fixtures/prisma/sqlite']
    .map((dir) => join(root, dir))
    .filter((dir) => {
      try {
        return (
          statSync(join(dir, 'generated/client.js')).mtimeMs <= statSync(join(dir, 'schema.prisma')).mtimeMs
        );
      } catch {
        return true;
      }
    })
    .map((dir) => join(dir, 'schema.prisma'));
  if (schemas.length === 0) return;
  execFileSync(process.execPath, [join(root, 'examples/orm/prisma/generate.js'), ...schemas], {
    cwd: root,
    stdio: 'inherit',
  });
}

export default function buildDist(): void {
  generatePrismaClients();
  if (staleOutputs().length === 0) return;
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  let output = '';
  try {
    execFileSync(process.execPath, [tsc, '-p', 'tsconfig.build.json'], { cwd: root, encoding: 'utf8' });
  } catch (error) {
    // tsc still emits when some file has a type error (typecheck reports those); only missing
    // output is fatal here.
    output = String((error as { stdout?: string }).stdout ?? error);
  }
  const stale = staleOutputs();
  if (stale.length > 0) throw new Error(`building dist/ left ${stale.join(', ')} stale:\n${output}`);
}
