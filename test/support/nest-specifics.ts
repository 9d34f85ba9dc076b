import {
  type ArgumentsHost,
  Body,
  type CanActivate,
  Catch,
  type ExceptionFilter,
  type ExecutionContext,
  Header,
  HttpCode,
  HttpException,
  type INestApplication,
  Module,
  Post,
  Req,
  Res,
  UnprocessableEntityException,
  UseFilters,
  UseGuards,
} from '@nestjs/common';
import { APP_FILTER, BaseExceptionFilter, HttpAdapterHost } from '@nestjs/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyCtx, Idempotent, type NestRequest, RetrysafeModule } from '../../src/adapters/nestjs.js';
import type { IdempotencyStore } from '../../src/core/contract/index.js';
import type { IdempotencyContext } from '../../src/core/index.js';
import { memoryStore } from '../../src/stores/memory.js';
import { describeAdapterConformance } from '../../src/testing/adapter-suite.js';
import {
  controller,
  nestAdapter,
  type Platform,
  type PlatformReply,
  startNest,
  urlOf,
} from './nest-harness.js';
import { memory, postgres, redis, sqlite } from './store-factories.js';

/** One Nest major's tests, on each platform: the conformance suite on every kind of store, then the specifics. */
export function describeNest(major: string): void {
  for (const platform of ['express', 'fastify'] as const) {
    const label = `${major} (platform-${platform})`;
    describeAdapterConformance(nestAdapter(label, platform), [memory, sqlite, postgres, redis]);
    describeNestSpecifics(label, platform);
  }
}

/** Nest's own paths around the interceptor: guards, exception filters, pipes, @HttpCode/@Header, @Res(). */
function describeNestSpecifics(label: string, platform: Platform): void {
  describe(`nest specifics: ${label}`, () => {
    const store = memoryStore();
    let app: INestApplication;
    let url: string;
    const runs: Record<string, number> = {};
    const run = (name: string) => {
      runs[name] = (runs[name] ?? 0) + 1;
      return runs[name];
    };

    class Denied implements CanActivate {
      canActivate(context: ExecutionContext): boolean {
        return context.switchToHttp().getRequest<NestRequest>().headers['x-deny'] === undefined;
      }
    }
    class Rendered implements ExceptionFilter {
      catch(exception: HttpException, host: ArgumentsHost) {
        const res = host.switchToHttp().getResponse<PlatformReply>();
        const body = { filtered: exception.message };
        if (res.raw) res.code(exception.getStatus()).send(body);
        else res.status(exception.getStatus()).json(body);
      }
    }
    Catch(HttpException)(Rendered);
    /** Nest's default answers, and a record of every exception that reached them. */
    const caught: unknown[] = [];
    class Recorder extends BaseExceptionFilter {
      override catch(exception: unknown, host: ArgumentsHost) {
        caught.push(exception);
        super.catch(exception, host);
      }
    }
    Catch()(Recorder);

    const echo = (name: string) => (body: unknown, idem: IdempotencyContext | undefined) => ({
      n: run(name),
      key: idem?.key ?? null,
      body,
    });
    const bodyAndCtx = [Body(), IdempotencyCtx()];

    beforeAll(async () => {
      class StoreModule {}
      Module({ providers: [{ provide: 'STORE', useValue: store }], exports: ['STORE'] })(StoreModule);
      const Routes = controller({
        guarded: {
          handler: echo('guarded'),
          decorators: [Post('guarded'), UseGuards(Denied)],
          params: bodyAndCtx,
        },
        filtered: {
          handler: () => {
            run('filtered');
            throw new UnprocessableEntityException('bad isbn');
          },
          decorators: [Post('filtered'), UseFilters(new Rendered())],
        },
        coded: {
          handler: echo('coded'),
          decorators: [Post('coded'), HttpCode(202), Header('cache-control', 'no-store')],
          params: bodyAndCtx,
        },
        required: {
          handler: echo('required'),
          decorators: [Post('required'), Idempotent({ required: true })],
          params: bodyAndCtx,
        },
        unguarded: {
          handler: echo('unguarded'),
          decorators: [Post('unguarded'), Idempotent(false)],
          params: bodyAndCtx,
        },
        own: {
          handler: (req: NestRequest, res: PlatformReply) => {
            const n = run('own');
            const body = JSON.stringify({ n, own: true });
            if (res.raw) res.code(201).header('content-type', 'application/json').send(body);
            else res.status(201).type('application/json').send(body);
            return req.method;
          },
          decorators: [Post('own')],
          params: [Req(), Res()],
        },
      });
      app = await startNest(platform, {
        imports: [
          RetrysafeModule.forRootAsync({
            imports: [StoreModule],
            inject: ['STORE'],
            useFactory: (injected: IdempotencyStore) => ({ store: injected }),
          }),
        ],
        controllers: [Routes],
        providers: [
          {
            provide: APP_FILTER,
            useFactory: (host: HttpAdapterHost) => new Recorder(host.httpAdapter),
            inject: [HttpAdapterHost],
          },
        ],
      });
      url = urlOf(app);
    });
    afterAll(async () => {
      await app?.close();
      await store.close();
    });

    async function post(path: string, key?: string, headers: Record<string, string> = {}, body = '{"a":1}') {
      const res = await fetch(url + path, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          ...headers,
          ...(key ? { 'idempotency-key': key } : {}),
        },
        body,
        signal: AbortSignal.timeout(10_000),
      });
      return { status: res.status, headers: res.headers, text: await res.text() };
    }

    it('a guard runs first: a request it refuses never claims the key', async () => {
      expect((await post('/guarded', 'guard-1', { 'x-deny': '1' })).status).toBe(403);
      const allowed = await post('/guarded', 'guard-1');
      expect(allowed.status).toBe(201);
      expect(allowed.headers.get('idempotency-replayed')).toBeNull();
      expect(JSON.parse(allowed.text)).toEqual({ n: 1, key: 'guard-1', body: { a: 1 } });
      expect((await post('/guarded', 'guard-1')).headers.get('idempotency-replayed')).toBe('true');
      expect(runs.guarded).toBe(1);
    });

    it("an exception goes through the route's exception filter and releases the key", async () => {
      const first = await post('/filtered', 'filter-1');
      expect([first.status, JSON.parse(first.text)]).toEqual([422, { filtered: 'bad isbn' }]);
      const retry = await post('/filtered', 'filter-1');
      expect(retry.status).toBe(422);
      expect(retry.headers.get('idempotency-replayed')).toBeNull();
      expect(runs.filtered).toBe(2);
    });

    it('@HttpCode and @Header: the replay has the same status and the allowlisted headers', async () => {
      const first = await post('/coded', 'coded-1');
      expect([first.status, first.headers.get('cache-control')]).toEqual([202, 'no-store']);
      const replay = await post('/coded', 'coded-1');
      expect(replay.status).toBe(202);
      expect(replay.headers.get('idempotency-replayed')).toBe('true');
      expect(replay.text).toBe(first.text);
      expect(replay.headers.get('content-type')).toBe(first.headers.get('content-type'));
    });

    it('@Idempotent: per-route options, and false leaves a route unguarded', async () => {
      const missing = await post('/required');
      expect(missing.status).toBe(400);
      expect(JSON.parse(missing.text)).toMatchObject({ error: 'idempotency_key_missing' });
      expect(runs.required).toBeUndefined();
      await post('/unguarded', 'free-1');
      const again = await post('/unguarded', 'free-1');
      expect(again.headers.get('idempotency-replayed')).toBeNull();
      expect(JSON.parse(again.text)).toMatchObject({ n: 2, key: null });
    });

    it('a route answering through @Res() is captured, and its replay is sent once', async () => {
      caught.length = 0;
      const first = await post('/own', 'own-1');
      expect([first.status, first.text]).toEqual([201, '{"n":1,"own":true}']);
      const replay = await post('/own', 'own-1');
      expect(replay.headers.get('idempotency-replayed')).toBe('true');
      expect([replay.status, replay.text]).toEqual([201, first.text]);
      const conflict = await post('/own', 'own-1', {}, '{"a":2}');
      expect(conflict.status).toBe(409);
      expect(JSON.parse(conflict.text)).toMatchObject({ error: 'key_conflict' });
      expect(runs.own).toBe(1);
      // Nest went on quietly: nothing reached its exception filters.
      expect(caught).toEqual([]);
    });
  });
}
