import type { IncomingHttpHeaders, IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import {
  type CallHandler,
  createParamDecorator,
  type DynamicModule,
  type ExecutionContext,
  type InjectionToken,
  type ModuleMetadata,
  type NestInterceptor,
  Next,
  Res,
} from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { Observable, type Subscriber } from 'rxjs';
import {
  createIdempotency,
  type Idempotency,
  parsedBody,
  type RequestBody,
  type StoredResponse,
} from '../core/adapter.js';
import type { IdempotencyError, RegisteredTx } from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import type { IdempotencyOptions } from '../core/options/index.js';
import {
  capture,
  clearForAnswer,
  discard,
  engineOptionsOf,
  type Injectable,
  injectDispatch,
  keyHeaderOf,
  type NodeListener,
  nodeDispatch,
  RESUME_HEADER,
  type Resume,
  type ResumesThrough,
  readBody,
  resumeVia,
  runResumed,
  send,
  sendAnswer,
  takeResume,
  toDictionaryMode,
} from './kit/index.js';

/**
 * The request as Nest hands it to `scope`: Express's `Request` on @nestjs/platform-express,
 * Fastify's `FastifyRequest` on @nestjs/platform-fastify.
 */
export interface NestRequest {
  method: string;
  url: string;
  originalUrl?: string;
  headers: IncomingHttpHeaders;
  body?: unknown;
  rawBody?: Buffer;
  /** Fastify's node:http request. */
  raw?: IncomingMessage;
}

/** A Nest application, as `resumeThrough` reaches its platform (Express or Fastify). */
export interface NestApplication {
  getHttpAdapter(): { getInstance(): unknown };
}

/** Options of `RetrysafeModule.forRoot`: the engine's over Nest's request. */
export type NestIdempotencyOptions<Tx = RegisteredTx> = IdempotencyOptions<NestRequest, Tx>;

/** A route's own options, merged over the module's; `false` leaves the route unguarded. */
export type RouteIdempotency = Partial<Omit<NestIdempotencyOptions<unknown>, 'store'>> | false;

/** The injection token of the module's options (what `forRootAsync`'s factory returns). */
export const RETRYSAFE_OPTIONS: InjectionToken = Symbol('retrysafe options');

const routeOptions = new WeakMap<object, RouteIdempotency>();
const contexts = new WeakMap<object, IdempotencyContext<unknown>>();

/**
 * Per-route (on a method) or per-controller (on a class) options over the module's: e.g.
 * `@Idempotent({ required: true, ttl: '7d' })`, or `@Idempotent(false)` to leave it unguarded.
 */
export function Idempotent(options: RouteIdempotency = {}): MethodDecorator & ClassDecorator {
  return (target: object, _key?: string | symbol, descriptor?: PropertyDescriptor) => {
    routeOptions.set(descriptor?.value ?? target, options);
  };
}

/**
 * The handler parameter holding the request's {@link IdempotencyContext} (`key`, `scope`, `tx`
 * in atomic mode, `downstreamKey(purpose)`); `undefined` when the request is not guarded. A
 * parameter decorator carries no type: annotate it `IdempotencyContext` (its `tx` is the
 * transaction type the project registers) or `IdempotencyContext<YourTx>`.
 */
export const IdempotencyCtx: () => ParameterDecorator = createParamDecorator(
  (_data: unknown, context: ExecutionContext) => contexts.get(context.switchToHttp().getRequest()),
);

/**
 * Guards Nest routes with Idempotency-Key, on @nestjs/platform-express and
 * @nestjs/platform-fastify. It runs where interceptors run: after middleware, body parsing and
 * guards, so a request a guard refuses never claims its key. What the route sends (its return
 * value with `@HttpCode`/`@Header`, or what it writes through `@Res()`) is captured from the
 * node:http response, saved, and replayed to retries byte for byte. An exception the handler or
 * a pipe throws releases the key, then goes through your exception filters as usual (never
 * replayed). Engine errors (400, 409/422, 413, 503) are answered as JSON, or `onError`'s rendering.
 * Register it app-wide with {@link RetrysafeModule}, or `app.useGlobalInterceptors(new
 * IdempotencyInterceptor({ store }))`.
 */
export class IdempotencyInterceptor<Tx = RegisteredTx>
  implements NestInterceptor, ResumesThrough<NestApplication>
{
  readonly #options: NestIdempotencyOptions<Tx>;
  readonly #engine: Idempotency<NestRequest, Tx>;
  readonly #routeEngines = new WeakMap<object, Idempotency<NestRequest, Tx> | undefined>();

  constructor(options: NestIdempotencyOptions<Tx>) {
    this.#options = options;
    this.#engine = createIdempotency<NestRequest, Tx>(engineOptionsOf('RetrysafeModule options', options));
  }

  /**
   * The completer's way into the app, through its platform: Express's app on
   * @nestjs/platform-express, Fastify's `inject` on @nestjs/platform-fastify. With
   * {@link RetrysafeModule}: `app.get(IdempotencyInterceptor).resumeThrough(app)`.
   */
  resumeThrough(app: NestApplication): Resume {
    const platform = app.getHttpAdapter().getInstance();
    const dispatch =
      typeof (platform as Partial<Injectable>).inject === 'function'
        ? injectDispatch(platform as Injectable)
        : nodeDispatch(() => platform as NodeListener);
    return resumeVia(this.#engine, dispatch);
  }

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() !== 'http') return next.handle();
    const engine = this.#engineFor(context);
    if (engine === undefined) return next.handle();
    const http = context.switchToHttp();
    const req = http.getRequest<NestRequest>();
    const reply = http.getResponse<{ raw?: ServerResponse } & ServerResponse>();
    const rawReq = req.raw ?? (req as unknown as IncomingMessage);
    const res = reply.raw ?? reply;
    const resume = takeResume(req.headers[RESUME_HEADER]);
    if (resume !== undefined) {
      return new Observable((subscriber) => {
        contexts.set(req, resume.ctx);
        runResumed(resume, res, () => runRoute(next, subscriber)).catch((error: unknown) =>
          subscriber.error(error),
        );
      });
    }
    if (req.raw === undefined) {
      // @nestjs/platform-express: Express's objects, with their prototypes swapped.
      toDictionaryMode(rawReq);
      toDictionaryMode(res);
    }
    const handled = respondsItself(context.getClass(), context.getHandler());
    return new Observable((subscriber) => {
      // Headers set before the route ran (middleware, @Header): kept on every answer.
      const before = res.getHeaders();
      let ran = false;
      engine
        .handle(
          {
            method: req.method,
            path: req.originalUrl ?? req.url,
            keyHeader: keyHeaderOf(rawReq, engine.keyHeader),
            contentType: req.headers['content-type'],
            acceptEncoding: req.headers['accept-encoding'],
            authorization: req.headers.authorization,
            readBody: () => bodyOf(req, rawReq, engine),
            raw: req,
          },
          (ctx) => {
            ran = true;
            contexts.set(req, ctx);
            return capture(engine, res, () => runRoute(next, subscriber), engine.answerHeaders(ctx.key));
          },
        )
        .then((outcome) => {
          switch (outcome.kind) {
            case 'pass':
              return void next.handle().subscribe(subscriber);
            case 'executed':
              return sendAnswer(res, outcome, before);
            case 'replayed':
              // After the route ran too when its lease was lost: its own response is dropped.
              return answerInstead(rawReq, res, before, outcome.response, handled || ran, subscriber);
            case 'rejected':
              return answerInstead(
                rawReq,
                res,
                before,
                engine.render(outcome.error),
                handled || ran,
                subscriber,
                outcome.error,
              );
          }
        })
        // The handler's own error (the key is released by now), or the user's `scope` failing:
        // Nest's exception filters answer it.
        .catch((error: unknown) => subscriber.error(error));
    });
  }

  #engineFor(context: ExecutionContext): Idempotency<NestRequest, Tx> | undefined {
    const handler = context.getHandler();
    if (this.#routeEngines.has(handler)) return this.#routeEngines.get(handler);
    const own = routeOptions.get(handler) ?? routeOptions.get(context.getClass());
    const engine =
      own === false
        ? undefined
        : own === undefined
          ? this.#engine
          : createIdempotency<NestRequest, Tx>({
              ...this.#options,
              ...engineOptionsOf('@Idempotent() options', own),
            });
    this.#routeEngines.set(handler, engine);
    return engine;
  }
}

/** Runs the route; settles when it has emitted its value (Nest then sends it) or failed. */
function runRoute(next: CallHandler, subscriber: Subscriber<unknown>): Promise<void> {
  return new Promise((resolve, reject) => {
    next.handle().subscribe({
      next: (value) => subscriber.next(value),
      error: reject,
      complete: () => {
        subscriber.complete();
        resolve();
      },
    });
  });
}

/**
 * Sends a replay or an engine error in place of the route. Nest still sends a response of its
 * own once the interceptor completes, unless the route took `@Res()`: that one is discarded.
 * After the route ran (atomic mode could not commit), nothing of it may leak.
 */
function answerInstead(
  req: IncomingMessage,
  res: ServerResponse,
  before: OutgoingHttpHeaders,
  response: StoredResponse,
  nestIsDone: boolean,
  subscriber: Subscriber<unknown>,
  error?: IdempotencyError,
): void {
  const answer = () => {
    clearForAnswer(req, res, before, error);
    send(res, response);
  };
  if (nestIsDone) {
    answer();
    // A value Nest ignores: an interceptor that completes empty is an error (EmptyError) to Nest.
    subscriber.next(undefined);
    subscriber.complete();
    return;
  }
  discard(res, () => {
    subscriber.next(undefined);
    subscriber.complete();
  }).then(answer, (error: unknown) => subscriber.error(error));
}

// Nest records a route's parameters as metadata of its controller method, under names that are
// not public API. A probe decorated with Nest's public @Res() and @Next() shows where and how
// each is recorded; a route is then read the same way.
class Probe {}
let probes = 0;

/** The metadata key and parameter entry `decorator` records for parameter `index` of a method. */
function recordOf(decorator: ParameterDecorator, index: number): { keys: string[]; entry: string } {
  const method = `probe${probes++}`;
  decorator(Probe.prototype, method, index);
  const keys: string[] = Reflect.getOwnMetadataKeys(Probe, method);
  return { keys, entry: Object.keys(Reflect.getOwnMetadata(keys[0], Probe, method) ?? {})[0] as string };
}

const ROUTE_ARGS = recordOf(Res(), 0).keys[0];
const PASSTHROUGH = recordOf(Res({ passthrough: true }), 0).keys.find((key) => key !== ROUTE_ARGS);
const leavesResponse = new Map<number, [string, string]>();

/** The entries of a route parameter at `index` that take the response from Nest: `@Res()`, `@Next()`. */
function takingResponse(index: number): [string, string] {
  let entries = leavesResponse.get(index);
  if (entries === undefined) {
    entries = [recordOf(Res(), index).entry, recordOf(Next(), index).entry];
    leavesResponse.set(index, entries);
  }
  return entries;
}

const respondingRoutes = new WeakMap<object, boolean>();

/** Nest leaves the response to a route that takes `@Res()` or `@Next()` without passthrough. */
function respondsItself(host: object, handler: { readonly name: string }): boolean {
  let responds = respondingRoutes.get(handler);
  if (responds !== undefined) return responds;
  const method = handler.name;
  const params: Record<string, { index: number }> = Reflect.getMetadata(ROUTE_ARGS, host, method) ?? {};
  const takesResponse = Object.entries(params).some(([entry, { index }]) =>
    takingResponse(index).includes(entry),
  );
  responds = takesResponse && !(PASSTHROUGH && Reflect.getMetadata(PASSTHROUGH, host, method));
  respondingRoutes.set(handler, responds);
  return responds;
}

async function bodyOf(
  req: NestRequest,
  rawReq: IncomingMessage,
  engine: Idempotency<NestRequest, unknown>,
): Promise<RequestBody> {
  // The platform's parser read the body: fingerprint its bytes (`rawBody: true`) or what it
  // parsed. One that skipped this content type may still leave a `req.body` (body-parser 1: `{}`)
  // but leaves the stream unread.
  if (req.rawBody !== undefined || rawReq.readableEnded || (rawReq as { _body?: boolean })._body) {
    return req.rawBody ?? parsedBody(req.body);
  }
  // No parser took this content type: read it, and leave it in `req.body` as a Buffer.
  const body = await readBody(rawReq, engine);
  req.body = body;
  return body;
}

/** Options of `RetrysafeModule.forRootAsync`: a factory of the options, with what it injects. */
export interface RetrysafeModuleAsyncOptions<Tx = RegisteredTx> extends Pick<ModuleMetadata, 'imports'> {
  useFactory: (...args: never[]) => NestIdempotencyOptions<Tx> | Promise<NestIdempotencyOptions<Tx>>;
  inject?: InjectionToken[];
}

/**
 * Registers {@link IdempotencyInterceptor} app-wide (as `APP_INTERCEPTOR`): every POST/PATCH
 * route is guarded by the module's options; `@Idempotent(options)` overrides them per route or
 * controller, `@Idempotent(false)` leaves one unguarded.
 * @example
 * RetrysafeModule.forRoot({ store: postgresStore({ url }), ttl: '7d' })
 * RetrysafeModule.forRootAsync({ inject: [ConfigService], useFactory: (config) => ({ store: ... }) })
 */
// biome-ignore lint/complexity/noStaticOnlyClass: Nest names a dynamic module by its class.
export class RetrysafeModule {
  static forRoot<Tx = RegisteredTx>(options: NestIdempotencyOptions<Tx>): DynamicModule {
    // Built here so bad options fail at startup, not at the first request.
    const interceptor = new IdempotencyInterceptor(options);
    return {
      module: RetrysafeModule,
      providers: [
        { provide: RETRYSAFE_OPTIONS, useValue: options },
        { provide: IdempotencyInterceptor, useValue: interceptor },
        { provide: APP_INTERCEPTOR, useExisting: IdempotencyInterceptor },
      ],
      exports: [RETRYSAFE_OPTIONS, IdempotencyInterceptor],
    };
  }

  static forRootAsync<Tx = RegisteredTx>(options: RetrysafeModuleAsyncOptions<Tx>): DynamicModule {
    return {
      module: RetrysafeModule,
      imports: options.imports ?? [],
      providers: [
        { provide: RETRYSAFE_OPTIONS, useFactory: options.useFactory, inject: options.inject ?? [] },
        {
          provide: IdempotencyInterceptor,
          useFactory: (resolved: NestIdempotencyOptions<Tx>) => new IdempotencyInterceptor(resolved),
          inject: [RETRYSAFE_OPTIONS],
        },
        { provide: APP_INTERCEPTOR, useExisting: IdempotencyInterceptor },
      ],
      exports: [RETRYSAFE_OPTIONS, IdempotencyInterceptor],
    };
  }
}
