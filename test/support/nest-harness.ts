import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  Controller,
  Delete,
  Get,
  HttpCode,
  HttpException,
  type INestApplication,
  Module,
  type ModuleMetadata,
  Patch,
  Post,
  Put,
  Req,
  Res,
  ServiceUnavailableException,
  StreamableFile,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { throwError } from 'rxjs';
import {
  IdempotencyCtx,
  IdempotencyInterceptor,
  type NestRequest,
  RetrysafeModule,
} from '../../src/adapters/nestjs.js';
import type { IdempotencyContext } from '../../src/core/index.js';
import { type AdapterUnderTest, paced, plan, type RunningApp } from '../../src/testing/adapter-suite.js';

/**
 * Nest apps for the adapter tests, written without decorator syntax (the project compiles
 * without `experimentalDecorators`): each decorator is applied by calling it, as TypeScript's
 * legacy decorators would. The test files import this under Nest 12 (the root install) or, with
 * the @nestjs packages mocked to test/nest11's, under Nest 11.
 */
export type Platform = 'express' | 'fastify';

type Handler = (...args: never[]) => unknown;

/** A controller class with `routes`: method name → handler, its decorators, its parameters' decorators. */
export function controller(
  routes: Record<string, { handler: Handler; decorators: MethodDecorator[]; params?: ParameterDecorator[] }>,
  classDecorators: ClassDecorator[] = [],
): new () => object {
  class Routes {}
  for (const [name, { handler, decorators, params = [] }] of Object.entries(routes)) {
    // Nest reads a route's parameters by the method's name, as a class method would have it.
    const method = { [name]: (...args: never[]) => handler(...args) }[name]!;
    Object.defineProperty(Routes.prototype, name, { value: method, writable: true, configurable: true });
    const descriptor = Object.getOwnPropertyDescriptor(Routes.prototype, name)!;
    for (const [index, decorate] of params.entries()) decorate(Routes.prototype, name, index);
    for (const decorate of [...decorators].reverse()) decorate(Routes.prototype, name, descriptor);
  }
  for (const decorate of [...classDecorators, Controller()]) decorate(Routes);
  return Routes;
}

const BODY_LIMIT = 10 * 1024 * 1024;

export async function startNest(platform: Platform, metadata: ModuleMetadata): Promise<INestApplication> {
  class AppModule {}
  Module(metadata)(AppModule);
  // The platforms' body limits are raised past the suite's largest upload (as express.json() in
  // the Express tests), so that maxBodyBytes is what answers.
  const app = await NestFactory.create(
    AppModule,
    platform === 'express' ? new ExpressAdapter() : new FastifyAdapter({ bodyLimit: BODY_LIMIT }),
    // abortOnError: false: a failed start throws instead of aborting the test worker.
    { logger: false, forceCloseConnections: true, abortOnError: false, bodyParser: platform === 'fastify' },
  );
  if (platform === 'express') {
    (app as NestExpressApplication)
      .useBodyParser('json', { limit: BODY_LIMIT })
      .useBodyParser('urlencoded', { extended: false });
  }
  await app.listen(0, '127.0.0.1');
  return app;
}

export function urlOf(app: INestApplication): string {
  const { port } = (app.getHttpServer() as Server).address() as AddressInfo;
  return `http://127.0.0.1:${port}`;
}

/** The methods used here of Express's `Response` and Fastify's `FastifyReply` (which has `raw`). */
export interface PlatformReply {
  raw?: unknown;
  code(status: number): PlatformReply;
  status(status: number): PlatformReply;
  headers(headers: Record<string, string>): PlatformReply;
  set(headers: Record<string, string>): PlatformReply;
  header(name: string, value: string): PlatformReply;
  type(type: string): PlatformReply;
  send(body: unknown): unknown;
  json(body: unknown): unknown;
}

/** Headers through the platform's response (`@Res({ passthrough: true })`). */
function setHeaders(res: PlatformReply, headers: Record<string, string>): void {
  if (res.raw) res.headers(headers);
  else res.set(headers);
}

/** How each throw path fails on its first call: Nest's error idioms. */
const FAILURES: Record<string, () => unknown> = {
  '/throw': () => {
    throw new Error('boom');
  },
  '/throw-async': async () => {
    await sleep(1);
    throw new Error('boom');
  },
  '/throw-observable': () => throwError(() => new Error('boom')),
  '/throw-http': () => {
    throw new ServiceUnavailableException();
  },
};
const THROW_PATHS = Object.keys(FAILURES);

export function nestAdapter(name: string, platform: Platform): AdapterUnderTest {
  return {
    name,
    throwPaths: THROW_PATHS,
    bodyParsers: 'before',
    async start({ scopeByAuthorization, ...options }) {
      const calls: Record<string, number> = {};
      const serve = async (req: NestRequest, res: PlatformReply, idem: IdempotencyContext | undefined) => {
        const url = new URL(req.originalUrl ?? req.url, 'http://x');
        const planned = plan(calls, req.method, url, idem, req.body);
        if (planned.delayMs) await sleep(planned.delayMs);
        setHeaders(res, planned.headers);
        switch (planned.kind) {
          case 'fail':
            return FAILURES[url.pathname]!();
          case 'json':
            // The 500 of /fail is Nest's idiom for an error response: an HttpException.
            if (planned.status >= 500) throw new HttpException(planned.json as object, planned.status);
            return planned.json;
          case 'text':
            return planned.text;
          case 'bytes':
            return new StreamableFile(planned.bytes);
          case 'stream':
            return new StreamableFile(Readable.from(paced(planned.chunks)));
          case 'empty':
            return undefined;
        }
      };
      // POST and PATCH /orders answer statuses @HttpCode cannot name (201, or a refusal that is
      // the operation's outcome): Nest's way is a route that takes @Res() and sends itself.
      const order = async (req: NestRequest, res: PlatformReply, idem: IdempotencyContext | undefined) => {
        const planned = plan(
          calls,
          req.method,
          new URL(req.originalUrl ?? req.url, 'http://x'),
          idem,
          req.body,
        );
        if (planned.kind !== 'json') throw new Error(`unexpected ${planned.kind}`);
        if (res.raw) res.code(planned.status).headers(planned.headers).send(planned.json);
        else res.status(planned.status).set(planned.headers).json(planned.json);
      };
      const params = [Req(), Res({ passthrough: true }), IdempotencyCtx()];
      const sendsItself = [Req(), Res(), IdempotencyCtx()];
      const route = (decorators: MethodDecorator[]) => ({ handler: serve, decorators, params });
      const Catalog = controller({
        postOrders: { handler: order, decorators: [Post('orders')], params: sendsItself },
        patchOrders: { handler: order, decorators: [Patch('orders')], params: sendsItself },
        getOrders: route([Get('orders')]),
        putOrders: route([Put('orders')]),
        deleteOrders: route([Delete('orders')]),
        text: route([Post('text'), HttpCode(200)]),
        buffer: route([Post('buffer'), HttpCode(200)]),
        stream: route([Post('stream'), HttpCode(200)]),
        fail: route([Post('fail')]),
        slow: route([Post('slow')]),
        empty: route([Post('empty'), HttpCode(204)]),
        gzip: route([Post('gzip'), HttpCode(200)]),
        form: route([Post('form')]),
        throwSync: route([Post('throw')]),
        throwAsync: route([Post('throw-async')]),
        throwObservable: route([Post('throw-observable')]),
        throwHttp: route([Post('throw-http')]),
      });
      const app = await startNest(platform, {
        imports: [
          RetrysafeModule.forRoot({
            ...options,
            ...(scopeByAuthorization ? { scope: (req) => req.headers.authorization ?? '' } : {}),
          }),
        ],
        controllers: [Catalog],
      });
      return {
        url: urlOf(app),
        calls,
        resume: app.get(IdempotencyInterceptor).resumeThrough(app),
        close: () => app.close(),
      } satisfies RunningApp;
    },
  };
}
