// Generates this example's Prisma client into ./generated and compiles it to JavaScript, with no
// download: `node examples/orm/prisma/generate.js` (`npm run build` runs it; app.js runs it when
// ./generated is missing). Given the paths of other schemas, it generates theirs instead, each into
// the `generated` folder beside its schema (the tests' MySQL and SQLite clients).
//
// Prisma 7's `prisma-client` generator needs no engine: the schema is read by a WebAssembly module
// inside the `prisma` package, and queries are compiled by one inside `@prisma/client`. But the
// CLI checks that its schema engine binary (used by `migrate` and `db`, never by `generate`) is
// on disk before running `generate`, and downloads it from binaries.prisma.sh when it is not,
// which fails offline. `PRISMA_SCHEMA_ENGINE_BINARY`, the documented way to name a custom schema
// engine, skips that download; when no engine is installed it names this file, which `generate`
// never runs.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const cli = require.resolve('prisma/build/index.js');
const engines = path.dirname(createRequire(cli).resolve('@prisma/engines/package.json'));
const installed = fs.readdirSync(engines).some((name) => name.startsWith('schema-engine-'));

const env = { ...process.env, CHECKPOINT_DISABLE: '1', PRISMA_HIDE_UPDATE_MESSAGE: '1' };
if (!installed) env.PRISMA_SCHEMA_ENGINE_BINARY ??= fileURLToPath(import.meta.url);

const schemas = process.argv.length > 2 ? process.argv.slice(2) : [path.join(here, 'schema.prisma')];
for (const schema of schemas) {
  const output = path.join(path.dirname(path.resolve(schema)), 'generated');
  fs.rmSync(output, { recursive: true, force: true });
  const generated = spawnSync(process.execPath, [cli, 'generate', '--schema', schema], {
    env,
    stdio: 'inherit',
  });
  if (generated.status !== 0) throw new Error(`prisma generate failed (exit ${generated.status})`);

  // The generator writes TypeScript only; Node 20 cannot run it, so each file is compiled on its
  // own (the generated code opts out of type checking with @ts-nocheck).
  for (const entry of fs.readdirSync(output, { recursive: true })) {
    const file = path.join(output, String(entry));
    if (!file.endsWith('.ts') || file.endsWith('.d.ts')) continue;
    const { outputText } = ts.transpileModule(fs.readFileSync(file, 'utf8'), {
      fileName: file,
      compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext },
    });
    fs.writeFileSync(file.replace(/\.ts$/, '.js'), outputText);
  }
}
