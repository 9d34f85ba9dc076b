import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { embedInPage } from '../bench/lib/report.js';
import { typeCheckAsUser } from './support/quick-start.js';

const root = join(import.meta.dirname, '..');
const read = (path: string) => readFileSync(join(root, path), 'utf8');
const readme = read('README.md');
const FRAMEWORKS = ['express', 'fastify', 'hono', 'koa', 'nestjs', 'node'];
// Plain JavaScript has no decorators, so the NestJS quick start applies them by hand, which no
// type checker follows; test/adapters.examples.test.ts runs it instead. The Next.js route handler
// imports its app's order list (app/orders.js); test/examples.nextjs.test.ts builds and runs it.
const RUN_NOT_CHECKED = [read('examples/nestjs/app.js'), read('examples/nextjs/app/orders/route.js')];
const pages = [
  'README.md',
  ...readdirSync(join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

/** Every fenced block of `lang` in a Markdown page. */
function blocks(page: string, lang: string): string[] {
  return [...read(page).matchAll(new RegExp(`^\`\`\`${lang}\\n([\\s\\S]*?)^\`\`\`$`, 'gm'))].map(
    (m) => m[1]!,
  );
}

describe('README quick starts', () => {
  // The quick starts are the example apps the adapter tests start, and the packed-tarball test
  // runs in fresh projects; this keeps the README's copies identical to them.
  it.each(FRAMEWORKS)('shows examples/%s/app.js verbatim', (framework) => {
    const source = read(`examples/${framework}/app.js`).trimEnd();
    expect(readme).toContain(`\`\`\`js\n${source}\n\`\`\``);
  });

  it('shows the Next.js route handler verbatim', () => {
    const source = read('examples/nextjs/app/orders/route.js').trimEnd();
    expect(readme).toContain(`\`\`\`js\n${source}\n\`\`\``);
  });

  it('shows the two commands, an outcomes table and the way to the rest', () => {
    expect(readme).toContain('npm install && npm start');
    expect(readme).toContain('npm install && npm test');
    expect(readme).toMatch(/^\| situation \| answer \|$/m);
    expect(readme).toContain('(docs/reference.md)');
    // The front door stays short: what does not fit goes to docs/ (420 since the ORM section).
    expect(readme.split('\n').length).toBeLessThanOrEqual(420);
  });
});

describe('README and docs', () => {
  it.each(pages)('%s links only to files that exist', (page) => {
    for (const [, target] of read(page).matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)) {
      if (/^https?:/.test(target!)) continue;
      expect(existsSync(join(root, dirname(page), target!)), `${page} → ${target}`).toBe(true);
    }
  });

  // A path written as code (`src/core/engine/state.ts`) names a file a reader will open.
  it.each([...pages, 'bench/README.md', 'examples/library-loans/README.md'])(
    '%s names only repository files that exist',
    (page) => {
      const named = /`((?:src|test|bench|examples|scripts|docs)\/[\w./-]+\.\w+)`/g;
      const missing = [...read(page).matchAll(named)]
        .map((m) => m[1]!)
        .filter((path) => !existsSync(join(root, path)));
      expect(missing).toEqual([]);
    },
  );

  it.each(pages)('%s runs only npm scripts and CLI commands that exist', (page) => {
    const scripts = Object.keys(JSON.parse(read('package.json')).scripts as Record<string, string>);
    const cli = read('src/cli.ts');
    for (const block of blocks(page, 'sh')) {
      for (const [, script] of block.matchAll(/\bnpm run (\w[\w:-]*)/g)) expect(scripts).toContain(script);
      for (const [, command] of block.matchAll(/\bnpx retrysafe (\w+)/g))
        expect(cli).toContain(`'${command}'`);
    }
  });

  // Every JavaScript and TypeScript block compiles under strict mode against the built package,
  // as a user's file would (`retrysafe/*` resolves to dist/ through the package's own exports).
  const dir = mkdtempSync(join(root, 'test', '.docs-blocks-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('every js and ts block type-checks', { timeout: 120_000 }, () => {
    let count = 0;
    for (const page of pages) {
      for (const lang of ['js', 'ts'] as const) {
        blocks(page, lang).forEach((block, i) => {
          if (RUN_NOT_CHECKED.includes(block)) return;
          writeFileSync(join(dir, `${page.replace(/\W/g, '_')}_${i}.${lang}`), `${block}export {};\n`);
          count++;
        });
      }
    }
    expect(count).toBeGreaterThan(8);
    const tsc = join(root, 'node_modules/typescript/bin/tsc');
    const options = {
      allowJs: true,
      checkJs: true,
      noEmit: true,
      skipLibCheck: true,
      typeRoots: [join(root, 'node_modules/@types')],
    };
    expect(typeCheckAsUser(dir, tsc, options, ['*.js', '*.ts'])).toBe('');
  });
});

describe('benchmarks page', () => {
  const page = read('docs/benchmarks.md');

  it('embeds bench/results/latest.md between the markers bench/run.js refreshes', () => {
    const start = page.indexOf('<!-- benchmarks -->\n');
    const end = page.indexOf('<!-- /benchmarks -->');
    expect(start).toBeGreaterThanOrEqual(0);
    expect(page.slice(start + '<!-- benchmarks -->\n'.length, end)).toBe(read('bench/results/latest.md'));
    expect(read('bench/run.js')).toContain("path.join(here, '..', 'docs', 'benchmarks.md')");
  });

  it('a refresh replaces only what lies between the markers', async () => {
    const copy = join(mkdtempSync(join(tmpdir(), 'retrysafe-bench-page-')), 'benchmarks.md');
    writeFileSync(copy, page);
    expect(await embedInPage('## fresh figures\n', copy)).toBe(true);
    const refreshed = readFileSync(copy, 'utf8');
    expect(refreshed).toContain('<!-- benchmarks -->\n## fresh figures\n<!-- /benchmarks -->');
    expect(refreshed.slice(0, refreshed.indexOf('<!-- benchmarks -->'))).toBe(
      page.slice(0, page.indexOf('<!-- benchmarks -->')),
    );
    rmSync(dirname(copy), { recursive: true, force: true });
  });
});
