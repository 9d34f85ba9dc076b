import { Transform } from 'node:stream';
import type {
  FastifyInstance,
  FastifyPluginCallback,
  FastifyReply,
  FastifyRequest,
  RequestPayload,
} from 'fastify';
import fastifyPlugin from 'fastify-plugin';
import {
  type AbandonedRecord,
  type CapturedResponse,
  createIdempotency,
  type Idempotency,
  type Outcome,
  type ResponseCollector,
  type StoredResponse,
} from '../core/adapter.js';
import {
  ConfigError,
  type IdempotencyError,
  type RegisteredTx,
  RetrysafeError,
} from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import type { IdempotencyOptions } from '../core/options/index.js';
import {
  type AdapterOptions,
  captureBody,
  checkAdapterOptions,
  closeAfterDrain,
  injectDispatch,
  RESUME_HEADER,
  type ResumesThrough,
  resumeVia,
  splitAdapterOptions,
  takeResume,
} from './kit/index.js';

/** Options of the `retrysafe/fastify` plugin: the engine's, plus the plugin's own. */
export interface FastifyIdempotencyOptions<Tx = RegisteredTx> extends IdempotencyOptions<FastifyRequest, Tx> {
  /**
   * `true`: the plugin answers engine errors (bad or missing key 400, conflict 409/422, in
   * progress 409, body too large 413, store down 503) itself, as JSON (or `onError`'s rendering).
   * `false`: they are thrown into Fastify's error path (`setErrorHandler`); the error is an
   * `IdempotencyError` with `statusCode`, `code`, `headers` (e.g. `retry-after`) and `key`.
   * @default true
   * @example renderErrors: false
   */
  renderErrors?: boolean;
}

/** A route's `config.idempotency`: overrides of the plugin's options, or `false` to leave it unguarded. */
export type FastifyRouteIdempotency = Partial<FastifyIdempotencyOptions> | false;

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by `retrysafe/fastify` on requests guarded by an Idempotency-Key; `undefined` otherwise. */
    idempotency: IdempotencyContext<RegisteredTx> | undefined;
  }
  interface FastifyContextConfig {
    idempotency?: FastifyRouteIdempotency;
  }
}

/** The request body as it arrived, teed off while Fastify parses it. */
interface RawBody {
  chunks: Buffer[];
  size: number;
  overflow: boolean;
}

/** A guarded request whose handler is running: the engine awaits its response. */
interface Pending {
  resolve: (response: CapturedResponse) => void;
  reject: (error: unknown) => void;
  /** A collector of the engine awaiting the response. */
  collect: () => ResponseCollector;
  /** The engine's outcome; `undefined` for a completer's resume, which nobody waits on. */
  outcome: Promise<Outcome> | undefined;
  settled: boolean;
}

// The plugin's engine (of its options, not a route's) on each instance it was registered on.
const engines = new WeakMap<FastifyInstance, Idempotency<FastifyRequest, unknown>>();

const plugin: FastifyPluginCallback<FastifyIdempotencyOptions> = fastifyPlugin(
  function retrysafe(
    fastify: FastifyInstance,
    options: FastifyIdempotencyOptions,
    done: (err?: Error) => void,
  ) {
    let defaults: RouteHooks;
    try {
      defaults = routeGuard(splitAdapterOptions('the retrysafe Fastify plugin', options));
    } catch (error) {
      return done(error as Error);
    }
    engines.set(fastify, defaults.engine);
    const overridden = new WeakMap<Partial<FastifyIdempotencyOptions>, RouteHooks>();
    const guardOf = (own: FastifyRouteIdempotency | undefined): RouteHooks | undefined => {
      if (own === false) return undefined;
      if (own === undefined) return defaults;
      let guard = overridden.get(own);
      if (guard === undefined) {
        const label = "a route's config.idempotency";
        guard = routeGuard(splitAdapterOptions(label, { ...options, ...checkAdapterOptions(label, own) }));
        overridden.set(own, guard);
      }
      return guard;
    };
    if (!fastify.hasRequestDecorator('idempotency')) fastify.decorateRequest('idempotency', undefined);
    // A route declared after the plugin loaded gets its guard as route hooks, after the route's
    // own: a route's preHandler (an auth check, say) runs before the key is claimed.
    fastify.addHook('onRoute', function retrysafeOnRoute(route) {
      const guard = guardOf(route.config?.idempotency);
      if (guard === undefined) return;
      route.config = Object.assign({ ...route.config }, { [GUARDED_BY_ROUTE_HOOKS]: true });
      const own = lifecycle(() => guard);
      route.preParsing = [...hooks(route.preParsing), own.preParsing];
      route.preHandler = [...hooks(route.preHandler), own.preHandler];
      route.onSend = [...hooks(route.onSend), own.onSend];
      route.onError = [...hooks(route.onError), own.onError];
    });
    // Routes declared before the plugin loaded (after a register that was not awaited) are
    // guarded by instance-wide hooks, which fastify-plugin keeps out of an encapsulated context.
    // They run before a route's own hooks; their route options are checked at the first request.
    const instance = lifecycle((request) => {
      const config = request.routeOptions.config;
      return GUARDED_BY_ROUTE_HOOKS in config ? undefined : guardOf(config.idempotency);
    });
    fastify.addHook('preParsing', instance.preParsing);
    fastify.addHook('preHandler', instance.preHandler);
    fastify.addHook('onSend', instance.onSend);
    fastify.addHook('onError', instance.onError);
    done();
  },
  { name: 'retrysafe', fastify: '5.x' },
);

/**
 * Fastify 5 plugin guarding POST/PATCH routes with Idempotency-Key. Plugin options are the
 * defaults of every route of the instance it is registered on, declared before or after it, with
 * or without `await` on the register (a route declared before the plugin loaded claims its key
 * before its own preHandler hooks, one declared after it, after them); a route's `config: { idempotency: {...} }` overrides them,
 * and `config: { idempotency: false }` leaves a route unguarded. The guarded handler finds
 * `request.idempotency`; what it sends (object, string, Buffer or stream) is captured in
 * `onSend`, saved, and replayed to retries byte for byte. A stream larger than
 * `maxResponseBytes` is streamed through in lease mode, not saved, and the key released. An
 * error the handler throws releases the key before Fastify's error handler answers it.
 * Fastify's own `bodyLimit` applies before `maxBodyBytes`. `idempotency.resumeThrough(app)` is the
 * completer's `resume` through the instance the plugin was registered on.
 * @example
 * app.register(idempotency, { store, ttl: '7d' });
 * app.post('/orders', { config: { idempotency: { required: true } } }, async (request, reply) => {
 *   reply.code(201).header('location', `/orders/${id}`);
 *   return { id, key: request.idempotency?.key };
 * });
 */
export const idempotency: FastifyPluginCallback<FastifyIdempotencyOptions> & ResumesThrough<FastifyInstance> =
  Object.assign(plugin, {
    // Through `inject`: the resumed request runs the route's hooks and handler, without a socket.
    // The plugin's options claim it; a route whose `config.idempotency` names another `route` is
    // not resumed.
    resumeThrough: (app: FastifyInstance) => {
      const dispatch = injectDispatch(app);
      return (record: AbandonedRecord, signal?: AbortSignal) => {
        const engine = engines.get(app);
        if (engine === undefined) {
          throw new ConfigError(
            'retrysafe: resumeThrough(app) needs the Fastify instance the retrysafe plugin was registered on, after `await app.register(idempotency, …)`',
          );
        }
        return resumeVia(engine, dispatch)(record, signal);
      };
    },
  });

/** Marks, in a route's config, a route guarded by route hooks, which the instance hooks skip. */
const GUARDED_BY_ROUTE_HOOKS = Symbol('retrysafe.guardedByRouteHooks');

function hooks<T>(value: T | T[] | undefined): T[] {
  if (value === undefined) return [];
  return Array.isArray(value) ? value : [value];
}

/** Fastify hooks that run the guard `pick` chooses for each request (none: the request passes). */
function lifecycle(pick: (request: FastifyRequest) => RouteHooks | undefined) {
  return {
    preParsing: function retrysafePreParsing(
      request: FastifyRequest,
      _reply: FastifyReply,
      payload: RequestPayload,
      done: (error: Error | null, payload?: RequestPayload) => void,
    ) {
      const guard = pick(request);
      if (guard === undefined) return done(null, payload);
      guard.preParsing(request, payload, done);
    },
    preHandler: async function retrysafePreHandler(request: FastifyRequest, reply: FastifyReply) {
      return pick(request)?.preHandler(request, reply);
    },
    onSend: async function retrysafeOnSend(request: FastifyRequest, reply: FastifyReply, payload: unknown) {
      const guard = pick(request);
      return guard === undefined ? payload : guard.onSend(request, reply, payload);
    },
    onError: async function retrysafeOnError(request: FastifyRequest, _reply: FastifyReply, error: Error) {
      await pick(request)?.onError(request, error);
    },
  };
}

/** What one set of options does at each step of a guarded route's lifecycle. */
interface RouteHooks {
  preParsing(
    request: FastifyRequest,
    payload: RequestPayload,
    done: (error: Error | null, payload: RequestPayload) => void,
  ): void;
  preHandler(request: FastifyRequest, reply: FastifyReply): Promise<unknown>;
  onSend(request: FastifyRequest, reply: FastifyReply, payload: unknown): Promise<unknown>;
  onError(request: FastifyRequest, error: Error): Promise<void>;
  /** The engine of these options. */
  engine: Idempotency<FastifyRequest, unknown>;
}

function routeGuard({ renderErrors, engineOptions }: AdapterOptions<FastifyIdempotencyOptions>): RouteHooks {
  const engine = createIdempotency<FastifyRequest, unknown>(engineOptions);
  const bodies = new WeakMap<FastifyRequest, RawBody>();
  const pending = new WeakMap<FastifyRequest, Pending>();

  const reject = (reply: FastifyReply, error: IdempotencyError) => {
    if (!renderErrors) throw error;
    return sendStored(reply, engine.render(error));
  };

  return {
    engine,
    preParsing(request, payload, done) {
      // Without a key there is nothing to fingerprint; a `key` function may find one anywhere.
      if (engine.keyHeader !== undefined && request.headers[engine.keyHeader] === undefined) {
        return done(null, payload);
      }
      const raw: RawBody = { chunks: [], size: 0, overflow: false };
      bodies.set(request, raw);
      // Fastify keeps parsing the stream as usual; the bytes are kept (up to maxBodyBytes) for
      // the fingerprint, which needs the body as sent rather than as parsed.
      const tee = new Transform({
        transform(chunk: Buffer, _encoding, callback) {
          if (!raw.overflow) {
            raw.size += chunk.length;
            if (raw.size > engine.maxBodyBytes) {
              raw.overflow = true;
              raw.chunks.length = 0;
            } else raw.chunks.push(chunk);
          }
          callback(null, chunk);
        },
      });
      payload.once('error', (error) => tee.destroy(error));
      // Fastify hears the request's error through the tee while it parses; once it stopped
      // reading (a body past its limit) the tee is orphaned, and its copy of the error must not
      // crash the process.
      tee.on('error', () => undefined);
      done(null, payload.pipe(tee));
    },

    async preHandler(request, reply) {
      const resume = takeResume(request.headers[RESUME_HEADER]);
      if (resume !== undefined) {
        request.idempotency = resume.ctx as IdempotencyContext<RegisteredTx>;
        resume.settle(
          new Promise<CapturedResponse>((resolve, rejectCapture) => {
            const collect = () => resume.collect();
            pending.set(request, {
              resolve,
              reject: rejectCapture,
              collect,
              outcome: undefined,
              settled: false,
            });
          }),
        );
        return;
      }
      let started!: () => void;
      const handlerStarted = new Promise<undefined>((resolve) => {
        started = () => resolve(undefined);
      });
      const outcome = engine.handle(
        {
          method: request.method,
          path: request.url,
          keyHeader: engine.keyHeader && request.headers[engine.keyHeader],
          contentType: request.headers['content-type'],
          acceptEncoding: request.headers['accept-encoding'],
          authorization: request.headers.authorization,
          readBody: () => {
            const raw = bodies.get(request);
            if (raw === undefined) return new Uint8Array(0);
            if (raw.overflow) throw engine.bodyTooLarge();
            return Buffer.concat(raw.chunks);
          },
          raw: request,
        },
        (ctx) =>
          new Promise<CapturedResponse>((resolve, rejectCapture) => {
            request.idempotency = ctx as IdempotencyContext<unknown> as IdempotencyContext<RegisteredTx>;
            reply.headers(engine.answerHeaders(ctx.key));
            pending.set(request, {
              resolve,
              reject: rejectCapture,
              collect: () => engine.collect(),
              outcome,
              settled: false,
            });
            started();
          }),
      );
      const first = await Promise.race([handlerStarted, outcome]);
      // The handler runs now; onSend or onError settles what the engine awaits.
      if (first === undefined) return;
      switch (first.kind) {
        case 'pass':
          return;
        case 'replayed':
          return sendStored(reply, first.response);
        case 'rejected':
          return reject(reply, first.error);
        case 'executed':
          throw new RetrysafeError('retrysafe: the engine completed a request whose handler never ran');
      }
    },

    async onSend(request, reply, payload) {
      // Fastify refuses an upload past its bodyLimit without reading the rest: read it off before
      // the connection closes, or the client gets a reset instead of this 413.
      if (reply.statusCode === 413) closeAfterDrain(request.raw, reply.raw);
      const waiting = pending.get(request);
      if (waiting === undefined || waiting.settled) return payload;
      waiting.settled = true;
      const collector = waiting.collect();
      const captured = await captureBody(collector, payload);
      waiting.resolve(collector.response(reply.statusCode, (name) => reply.getHeader(name)));
      const outcome = await waiting.outcome;
      if (outcome === undefined || (outcome.kind !== 'rejected' && outcome.kind !== 'replayed')) {
        return captured.payload;
      }
      // Atomic mode could not commit (or the response was too large to), or the handler's lease
      // was lost and another answer was saved: nothing of the handler's response may reach the
      // client, its headers included.
      for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
      const answer = outcome.kind === 'replayed' ? outcome.response : engine.render(outcome.error);
      reply.code(answer.status).headers(answer.headers);
      return Buffer.from(answer.body);
    },

    async onError(request, error) {
      const waiting = pending.get(request);
      if (waiting === undefined || waiting.settled) return;
      waiting.settled = true;
      waiting.reject(error);
      // The engine releases the key before rethrowing: wait, so a retry sent as soon as the
      // error response arrives finds the key free.
      await waiting.outcome?.catch(() => undefined);
    },
  };
}

function sendStored(reply: FastifyReply, response: StoredResponse): FastifyReply {
  return reply.code(response.status).headers(response.headers).send(Buffer.from(response.body));
}
