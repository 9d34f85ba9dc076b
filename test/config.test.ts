import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { idempotency as expressIdempotency } from '../src/adapters/express.js';
import { idempotency as fastifyIdempotency } from '../src/adapters/fastify.js';
import { idempotency as honoIdempotency } from '../src/adapters/hono.js';
import { idempotency as koaIdempotency } from '../src/adapters/koa.js';
import { IdempotencyInterceptor } from '../src/adapters/nestjs.js';
import { idempotency as nodeIdempotency } from '../src/adapters/node.js';
import { createRetryingFetch } from '../src/client/index.js';
import { createIdempotency } from '../src/core/adapter.js';
import { ConfigError, idempotency as misplacedIdempotency, RetrysafeError } from '../src/core/index.js';
import { memoryStore } from '../src/stores/memory.js';
import { postgresStore } from '../src/stores/postgres/index.js';
import { redisStore } from '../src/stores/redis/index.js';
import { sqliteStore } from '../src/stores/sqlite/index.js';

const store = memoryStore();

// Each factory with its required options and one misspelt option added.
const factories: [string, (typo: Record<string, unknown>) => unknown, string, string][] = [
  ['createIdempotency', (t) => createIdempotency({ store, ...t }), 'requried', 'required'],
  ['express idempotency()', (t) => expressIdempotency({ store, ...t }), 'renderError', 'renderErrors'],
  ['hono idempotency()', (t) => honoIdempotency({ store, ...t }), 'scpoe', 'scope'],
  ['node idempotency()', (t) => nodeIdempotency({ store, ...t }), 'ttL', 'ttl'],
  ['koa idempotency()', (t) => koaIdempotency({ store, ...t }), 'renderError', 'renderErrors'],
  ['NestJS RetrysafeModule options', (t) => new IdempotencyInterceptor({ store, ...t }), 'methds', 'methods'],
  ['memoryStore', (t) => memoryStore(t), 'maxRecord', 'maxRecords'],
  ['sqliteStore', (t) => sqliteStore({ database: new Database(':memory:'), ...t }), 'tabel', 'table'],
  ['postgresStore', (t) => postgresStore({ url: 'postgres://127.0.0.1/none', ...t }), 'schemma', 'schema'],
  ['redisStore', (t) => redisStore({ url: 'redis://127.0.0.1:1', ...t }), 'prefx', 'prefix'],
  ['createRetryingFetch', (t) => createRetryingFetch(t), 'maxAtempts', 'maxAttempts'],
];

describe('unknown options', () => {
  it.each(factories)(
    '%s throws a ConfigError naming the option and the nearest one',
    (_, make, typo, meant) => {
      const attempt = () => make({ [typo]: 1 });
      expect(attempt).toThrow(ConfigError);
      expect(attempt).toThrow(`\`${typo}\``);
      expect(attempt).toThrow(`Did you mean \`${meant}\`?`);
    },
  );

  it('any one-letter slip of a known name is caught and a name one letter away is suggested', () => {
    const known = ['store', 'mode', 'required', 'headerName', 'ttl', 'lease', 'concurrency', 'maxBodyBytes'];
    const slip = fc
      .tuple(fc.constantFrom(...known), fc.nat(), fc.constantFrom('', 'x', 'q'))
      .map(([name, at, letter]) => {
        const i = at % name.length;
        return name.slice(0, i) + letter + name.slice(i + 1);
      })
      .filter((typo) => typo !== '' && !known.includes(typo));
    fc.assert(
      fc.property(slip, (typo) => {
        let message = '';
        try {
          createIdempotency({ store, ...{ [typo]: 1 } });
        } catch (error) {
          expect(error).toBeInstanceOf(ConfigError);
          message = (error as Error).message;
        }
        const suggested = /Did you mean `(\w+)`\?/.exec(message)?.[1];
        expect(suggested, message).toBeDefined();
        expect(Math.abs(suggested!.length - typo.length)).toBeLessThanOrEqual(1);
      }),
    );
  });

  it('a name far from every option gets no suggestion', () => {
    expect(() => createIdempotency({ store, ...{ colour: 'blue' } })).toThrow(
      /no option `colour`\. Its options/,
    );
  });

  it('the Fastify plugin rejects them at registration and in a route config', async () => {
    const { default: Fastify } = await import('fastify');
    await expect(
      Fastify()
        .register(fastifyIdempotency, { store, ...{ requried: true } })
        .ready(),
    ).rejects.toThrow(/Did you mean `required`\?/);
  });
});

describe('every configuration error is a ConfigError', () => {
  it.each<[string, () => unknown]>([
    ['memoryStore maxRecords -1', () => memoryStore({ maxRecords: -1 })],
    ['memoryStore sweepIntervalMs 0', () => memoryStore({ sweepIntervalMs: 0 })],
    ['sqliteStore without a database', () => sqliteStore({})],
    ['sqliteStore bad table', () => sqliteStore({ database: new Database(':memory:'), table: 'a;b' })],
    [
      'sqliteStore poll bounds',
      () => sqliteStore({ database: new Database(':memory:'), pollIntervalMs: 50, maxPollIntervalMs: 10 }),
    ],
    ['postgresStore without a pool', () => postgresStore({})],
    ['postgresStore bad schema', () => postgresStore({ url: 'postgres://x/y', schema: 'a b' })],
    ['redisStore without a client', () => redisStore({})],
    [
      'redisStore bad prefix',
      () => redisStore({ url: 'redis://127.0.0.1:1', prefix: 1 as unknown as string }),
    ],
    ['client maxAttempts', () => createRetryingFetch({ maxAttempts: 1.5 })],
    ['client headerName', () => createRetryingFetch({ headerName: 'a b' })],
    ['options not an object', () => memoryStore('big' as never)],
  ])('%s', (_, make) => {
    expect(make).toThrow(ConfigError);
    expect(make).toThrow(RetrysafeError);
  });
});

describe("idempotency() imported from 'retrysafe' instead of a framework's entry", () => {
  const call = () => misplacedIdempotency({ store } as never);
  const root = join(import.meta.dirname, '..');
  const { exports } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
    exports: Record<string, unknown>;
  };
  // Every framework binding (src/adapters/*.ts), by the subpath a user imports it from.
  const bindings = readdirSync(join(root, 'src/adapters'))
    .filter((file) => file.endsWith('.ts'))
    .map((file) => `retrysafe/${file.slice(0, -'.ts'.length)}`);

  it('throws a ConfigError naming the entry of every framework binding, each a subpath the package exports', () => {
    expect(call).toThrow(ConfigError);
    let message = '';
    try {
      call();
    } catch (error) {
      message = (error as Error).message;
    }
    expect(bindings.length).toBeGreaterThan(8);
    for (const subpath of bindings) {
      expect(message).toContain(`'${subpath}'`);
      expect(exports).toHaveProperty([subpath.replace(/^retrysafe/, '.')]);
    }
    expect(message).toContain('https://github.com/retrysafe/retrysafe#quick-start');
  });
});
