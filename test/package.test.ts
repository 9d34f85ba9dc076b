import { execFile } from 'node:child_process';
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Dynalite, lambdaExampleEnv, startDynalite } from './support/dynalite.js';
import { checkGraphqlExample, checkTrpcExample } from './support/mutation-examples.js';
import {
  checkQuickStart,
  pack,
  run,
  serveOneReplay,
  TARBALL,
  typeCheckAsUser,
} from './support/quick-start.js';
import { hasPostgres, PG_URL, uniqueName } from './support/services.js';

/**
 * The package as a user gets it, following the README's install words: a fresh checkout (this
 * one's files without dist/), `npm pack` there, then `npm install <tarball>` into fresh projects
 * (ES-module JavaScript, strict TypeScript with `nodenext`, CommonJS), where every README quick
 * start runs. The tarball's own dependencies install from the npm cache; the frameworks, drivers
 * and @types a user adds next to it are linked from this repository's node_modules (better-sqlite3
 * builds natively, which an offline install cannot).
 */
const root = join(import.meta.dirname, '..');
const work = mkdtempSync(join(tmpdir(), 'retrysafe-package-'));
const FRAMEWORKS = ['express', 'fastify', 'hono', 'koa', 'nestjs', 'node'] as const;
// Plain JavaScript has no decorators: the NestJS quick start applies them by hand, which no type
// checker follows, and a TypeScript user writes them as decorators instead. @types/koa does not
// compile against the content-disposition it pulls in (without skipLibCheck), so Koa is left out.
const TYPESCRIPT_FRAMEWORKS = ['express', 'fastify', 'hono', 'node'] as const;
const PEERS = [
  'express',
  'fastify',
  'hono',
  '@hono/node-server',
  'koa',
  '@koa/bodyparser',
  '@nestjs/common',
  '@nestjs/core',
  '@nestjs/platform-express',
  'reflect-metadata',
  'rxjs',
  'better-sqlite3',
  '@trpc/server',
  'graphql',
  'graphql-yoga',
];
const TYPES = ['typescript', '@types/node', '@types/express', '@types/better-sqlite3'];
let checkout: string;
let tarball: string;
let files: string[];

function project(name: string, packageJson: object, links: string[]): string {
  const dir = join(work, name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name, private: true, ...packageJson }));
  run('npm', ['install', tarball, '--prefer-offline', '--no-audit', '--no-fund', '--ignore-scripts'], dir);
  for (const link of links) {
    mkdirSync(join(dir, 'node_modules', link, '..'), { recursive: true });
    symlinkSync(join(root, 'node_modules', link), join(dir, 'node_modules', link), 'dir');
  }
  return dir;
}

// The mutation examples (examples/<name>/app.js) and the contract each serves.
const MUTATION_EXAMPLES = [
  ['trpc', checkTrpcExample],
  ['graphql', checkGraphqlExample],
] as const;

const quickStart = (framework: string) => readFileSync(join(root, 'examples', framework, 'app.js'), 'utf8');

/** The same quick start for a CommonJS project: `require` for `import`, top-level await in a function. */
function asCommonJs(source: string): string {
  const body = source
    .replace(/^import (\w+) from '([^']+)';$/gm, "const $1 = require('$2');")
    .replace(/^import \{ ([^}]+) \} from '([^']+)';$/gm, "const { $1 } = require('$2');");
  return `(async () => {\n${body}\n})();\n`;
}

/**
 * Runs `file` with node from `dir` (in a working directory of its own, so each quick start has
 * its own idempotency.db): the quick start's promise, bad bodies included, over HTTP.
 */
const serveWithNode = (dir: string, file: string, check = checkQuickStart) =>
  serveOneReplay({
    command: process.execPath,
    args: [join(dir, file)],
    cwd: mkdtempSync(join(dir, 'run-')),
    check,
  });

beforeAll(() => {
  ({ tarball, files, checkout } = pack(work));
}, 360_000);
afterAll(() => {
  rmSync(work, { recursive: true, force: true });
});

describe('the tarball', () => {
  // pack() runs the README's `npm pack` and takes the tarball from where it says it lands;
  // project() installs it as its `npm install $RETRYSAFE` lines do.
  it("is made and installed as the README's Quick start says", () => {
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    const block = /## Quick start[\s\S]*?```sh\n([\s\S]*?)```/.exec(readme)?.[1] ?? '';
    expect(block).toContain(`(cd retrysafe && npm install && npm pack)   # writes ${TARBALL}\n`);
    expect(block).toContain(`RETRYSAFE=$PWD/retrysafe/${TARBALL}\n`);
    expect(block).toMatch(/^npm install \$RETRYSAFE /m);
    expect(tarball).toBe(join(checkout, TARBALL));
  });

  it('ships LICENSE, README, CHANGELOG and dist, nothing of src or test', () => {
    expect(files).toEqual(
      expect.arrayContaining(['LICENSE', 'README.md', 'CHANGELOG.md', 'package.json', 'dist/core/index.js']),
    );
    expect(
      files.every((file) => /^(dist\/|LICENSE$|README\.md$|CHANGELOG\.md$|package\.json$)/.test(file)),
    ).toBe(true);
  });

  it('source maps carry their sources, since src/ is not shipped', () => {
    const dist = join(checkout, 'dist');
    for (const map of files.filter((file) => file.endsWith('.js.map'))) {
      const parsed = JSON.parse(readFileSync(join(dist, '..', map), 'utf8')) as {
        sources: string[];
        sourcesContent?: string[];
      };
      expect(parsed.sourcesContent?.length, map).toBe(parsed.sources.length);
    }
  });

  it('declares only dependencies that dist uses', () => {
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
    };
    const shipped = files
      .filter((file) => /\.(js|d\.ts)$/.test(file))
      .map((file) => readFileSync(join(checkout, file), 'utf8'))
      .join('\n');
    for (const dependency of Object.keys(pkg.dependencies)) {
      const name = dependency.replace(/^@types\//, '');
      expect(shipped, dependency).toMatch(new RegExp(`from '${name}(/[^']*)?'`));
    }
  });
});

describe('an ES-module JavaScript project', () => {
  let dir: string;
  beforeAll(() => {
    dir = project('esm-js', { type: 'module' }, PEERS);
  }, 120_000);

  it.each(FRAMEWORKS)('runs the %s quick start', { timeout: 30_000 }, async (framework) => {
    writeFileSync(join(dir, `${framework}.js`), quickStart(framework));
    await serveWithNode(dir, `${framework}.js`);
  });

  it.each(MUTATION_EXAMPLES)('runs the %s example', { timeout: 30_000 }, async (name, check) => {
    writeFileSync(join(dir, `${name}.js`), quickStart(name));
    await serveWithNode(dir, `${name}.js`, check);
  });

  it.each([
    [
      'a misspelt option',
      "import { memoryStore } from 'retrysafe/memory';\nimport { idempotency } from 'retrysafe/express';\n" +
        'idempotency({ store: memoryStore(), requried: true });\n',
      /ConfigError: retrysafe: express idempotency\(\) has no option `requried`\. Did you mean `required`\?/,
    ],
    [
      "idempotency() imported from 'retrysafe', not from a framework's entry,",
      "import { idempotency } from 'retrysafe';\nimport { memoryStore } from 'retrysafe/memory';\n" +
        'idempotency({ store: memoryStore() });\n',
      /ConfigError: retrysafe: idempotency\(\) is not in 'retrysafe'; import it from your framework's entry: 'retrysafe\/express'/,
    ],
  ])('%s fails at once, saying what was meant', (_, source, message) => {
    writeFileSync(join(dir, 'mistaken.js'), source);
    let stderr = '';
    try {
      run(process.execPath, ['mistaken.js'], dir);
    } catch (error) {
      stderr = String((error as { stderr?: string }).stderr);
    }
    expect(stderr).toMatch(message);
  });

  it("'retrysafe' is the application's API; a binding's plumbing is in retrysafe/adapter, the store contract in retrysafe/store", () => {
    writeFileSync(
      join(dir, 'faces.js'),
      'const names = async (subpath) => Object.keys(await import(subpath));\n' +
        "console.log(JSON.stringify(await Promise.all(['retrysafe', 'retrysafe/adapter', 'retrysafe/store'].map(names))));\n",
    );
    const [app, adapter, store] = JSON.parse(run(process.execPath, ['faces.js'], dir)) as [
      string[],
      string[],
      string[],
    ];
    expect(app).toEqual(
      expect.arrayContaining(['idempotent', 'startCompleter', 'credentialScope', 'ConfigError']),
    );
    expect(adapter).toEqual(['createIdempotency', 'fingerprint', 'parseIdempotencyKey', 'parsedBody']);
    expect(store).toEqual(['MAX_LIST_LIMIT', 'isAtomicStore', 'isPhaseStore']);
    for (const plumbing of [...adapter, ...store]) expect(app).not.toContain(plumbing);
  });
});

describe('a strict TypeScript project (module nodenext)', () => {
  let dir: string;
  beforeAll(() => {
    dir = project('strict-ts', { type: 'module' }, [...PEERS, ...TYPES]);
    for (const framework of TYPESCRIPT_FRAMEWORKS)
      writeFileSync(join(dir, `${framework}.ts`), quickStart(framework));
  }, 120_000);

  it('compiles every quick start', { timeout: 120_000 }, () => {
    const tsc = join(dir, 'node_modules/typescript/bin/tsc');
    const options = { noUncheckedIndexedAccess: true, skipLibCheck: false, outDir: 'out' };
    expect(typeCheckAsUser(dir, tsc, options, ['*.ts'])).toBe('');
  });

  it("types a binding of one's own from retrysafe/adapter and a store from retrysafe/store; idempotency() from 'retrysafe' does not compile", {
    timeout: 120_000,
  }, () => {
    const faces = join(dir, 'faces');
    mkdirSync(faces, { recursive: true });
    writeFileSync(
      join(faces, 'faces.ts'),
      [
        "import { idempotency, type IdempotencyOptions } from 'retrysafe';",
        "import { createIdempotency, type IncomingRequest, type Outcome } from 'retrysafe/adapter';",
        "import { type IdempotencyStore, MAX_LIST_LIMIT } from 'retrysafe/store';",
        "import { memoryStore } from 'retrysafe/memory';",
        'const store: IdempotencyStore = memoryStore();',
        'const options: IdempotencyOptions = { store };',
        'export const handle = (request: IncomingRequest): Promise<Outcome> =>',
        '  createIdempotency(options).handle(request, async () => ({ status: 204, headers: {}, body: new Uint8Array(), complete: true }));',
        'export const limit: number = MAX_LIST_LIMIT;',
        'idempotency({ store });',
        '',
      ].join('\n'),
    );
    const tsc = join(dir, 'node_modules/typescript/bin/tsc');
    const output = typeCheckAsUser(faces, tsc, { noEmit: true, skipLibCheck: false }, ['faces.ts']);
    expect(output.trim().split('\n')).toEqual([
      expect.stringMatching(
        /^faces\.ts\(10,13\): error TS2345: .*"idempotency\(\) is not in 'retrysafe': import it from your framework's entry, e\.g\. 'retrysafe\/express' \(README: Quick start\)"/,
      ),
    ]);
  });

  it.each(TYPESCRIPT_FRAMEWORKS)(
    'runs the compiled %s quick start',
    { timeout: 30_000 },
    async (framework) => {
      await serveWithNode(dir, `out/${framework}.js`);
    },
  );
});

describe('a CommonJS project', () => {
  let dir: string;
  beforeAll(() => {
    dir = project('cjs', { type: 'commonjs' }, PEERS);
  }, 120_000);

  it.each(FRAMEWORKS)(
    "runs the %s quick start with require('retrysafe/…')",
    { timeout: 30_000 },
    async (framework) => {
      writeFileSync(join(dir, `${framework}.js`), asCommonJs(quickStart(framework)));
      await serveWithNode(dir, `${framework}.js`);
    },
  );

  it.each(MUTATION_EXAMPLES)(
    "runs the %s example with require('retrysafe/…')",
    { timeout: 30_000 },
    async (name, check) => {
      writeFileSync(join(dir, `${name}.js`), asCommonJs(quickStart(name)));
      await serveWithNode(dir, `${name}.js`, check);
    },
  );
});

describe('retrysafe/testing in a fresh project, with vitest and fast-check beside it as its peers', () => {
  let dir: string;
  beforeAll(() => {
    dir = project('esm-testing', { type: 'module' }, ['vitest', 'fast-check']);
  }, 120_000);

  it('runs the store conformance suite on retrysafe/memory: every test passes', { timeout: 120_000 }, () => {
    writeFileSync(
      join(dir, 'memory.test.js'),
      "import { memoryStore } from 'retrysafe/memory';\n" +
        "import { describeStoreConformance } from 'retrysafe/testing';\n" +
        "describeStoreConformance('memory', async () => ({ store: memoryStore() }));\n",
    );
    const vitest = join(dir, 'node_modules/vitest/vitest.mjs');
    run(process.execPath, [vitest, 'run', '--reporter=json', '--outputFile=report.json'], dir, 110_000);
    const report = JSON.parse(readFileSync(join(dir, 'report.json'), 'utf8')) as {
      numPassedTests: number;
      numFailedTests: number;
      numPendingTests: number;
    };
    expect(report.numFailedTests).toBe(0);
    expect(report.numPassedTests).toBeGreaterThan(40);
    // Atomic mode and phases: the memory store has neither, and the suite skips them.
    expect(report.numPendingTests).toBe(11);
  });
});

/** The ORM quick starts (`examples/orm/<orm>/`) and the packages each needs beside the tarball. */
const ORM_PEERS: Record<string, string[]> = {
  drizzle: ['drizzle-orm', 'pg'],
  kysely: ['kysely', 'pg'],
  knex: ['knex', 'pg'],
  typeorm: ['typeorm', 'pg', 'reflect-metadata'],
  prisma: ['@prisma/client', '@prisma/adapter-pg', 'pg'],
  sequelize: ['sequelize', 'pg'],
  'mikro-orm': ['@mikro-orm/core', '@mikro-orm/knex', '@mikro-orm/postgresql'],
};
const ORMS = Object.keys(ORM_PEERS).filter((orm) => existsSync(join(root, 'examples/orm', orm, 'app.js')));

describe.skipIf(!hasPostgres)(
  'the ORM quick starts in an ES-module project, each on a database of its own',
  () => {
    let dir: string;
    const admin = new pg.Pool({ connectionString: PG_URL, max: 1 });
    const databases: string[] = [];
    beforeAll(() => {
      dir = project('esm-orm', { type: 'module' }, [...new Set(Object.values(ORM_PEERS).flat())]);
    }, 120_000);
    afterAll(async () => {
      for (const name of databases) await admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
      await admin.end();
    });

    it.each(ORMS)(
      'runs the %s quick start: an order once per key, a conflict for another item',
      { timeout: 60_000 },
      async (orm) => {
        // The folder as a user copies it, generated files (Prisma's client, made by `npm run build`) included.
        cpSync(join(root, 'examples/orm', orm), join(dir, orm), { recursive: true });
        const database = uniqueName(`rs_pkg_${orm}`);
        await admin.query(`CREATE DATABASE "${database}"`);
        databases.push(database);
        const url = new URL(PG_URL);
        url.pathname = `/${database}`;
        await serveOneReplay({
          command: process.execPath,
          args: [join(dir, orm, 'app.js')],
          cwd: join(dir, orm),
          env: { DATABASE_URL: url.toString() },
          async check(base) {
            const post = (item: string) =>
              fetch(`${base}/orders`, {
                method: 'POST',
                headers: { 'content-type': 'application/json', 'idempotency-key': `${orm}-1` },
                body: JSON.stringify({ item }),
                signal: AbortSignal.timeout(15_000),
              });
            const first = await post('book');
            expect(first.status).toBe(201);
            const order = await first.json();
            expect(order).toMatchObject({ id: expect.anything(), item: 'book' });
            const retry = await post('book');
            expect(retry.headers.get('idempotency-replayed')).toBe('true');
            expect(await retry.json()).toEqual(order);
            expect((await post('pen')).status).toBe(409);
            const orders = await (await fetch(`${base}/orders`)).json();
            expect(orders).toEqual([order]);
          },
        });
      },
    );
  },
);

/** Invokes the copied handler as Lambda would: three duplicates at once, a conflict, the orders. */
const INVOKE_LAMBDA = `import { handler } from './handler.js';
const http = (method) => ({ requestContext: { http: { method, path: '/orders' } } });
const post = (item) =>
  handler({ ...http('POST'), headers: { 'idempotency-key': 'k-1' }, body: JSON.stringify({ item }) });
const duplicates = await Promise.all([post('book'), post('book'), post('book')]);
const conflict = await post('pen');
const orders = JSON.parse((await handler(http('GET'))).body);
console.log(JSON.stringify({ duplicates, conflict, orders }));
`;

describe('the Lambda example in an ES-module project, keys in DynamoDB (dynalite)', () => {
  let dir: string;
  let server: Dynalite;
  beforeAll(async () => {
    dir = project('esm-lambda', { type: 'module' }, ['@aws-sdk/client-dynamodb']);
    server = await startDynalite();
  }, 120_000);
  afterAll(() => server?.close());

  it('runs examples/lambda/handler.js with retrysafe/dynamodb from the tarball: one order per key', {
    timeout: 60_000,
  }, async () => {
    cpSync(join(root, 'examples/lambda'), join(dir, 'lambda'), { recursive: true });
    writeFileSync(join(dir, 'lambda', 'invoke.js'), INVOKE_LAMBDA);
    // Asynchronously: dynalite answers from this process meanwhile.
    const { stdout } = await promisify(execFile)(process.execPath, [join(dir, 'lambda', 'invoke.js')], {
      env: { ...process.env, ...(await lambdaExampleEnv(server)) },
      timeout: 50_000,
    });
    const { duplicates, conflict, orders } = JSON.parse(stdout) as {
      duplicates: { statusCode: number; body: string }[];
      conflict: { statusCode: number };
      orders: unknown[];
    };
    expect(duplicates.map((answer) => answer.statusCode)).toEqual([201, 201, 201]);
    expect(new Set(duplicates.map((answer) => answer.body)).size).toBe(1);
    expect(conflict.statusCode).toBe(409);
    expect(orders).toEqual([JSON.parse(duplicates[0]!.body)]);
  });
});
