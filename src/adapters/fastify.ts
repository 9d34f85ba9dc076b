import { Transform } from 'node:stream';
import type {
  FastifyInstance,
  FastifyPluginCallback,
  FastifyReply,
  FastifyRequest,
  onErrorHookHandler,
  onSendHookHandler,
  preHandlerAsyncHookHandler,
  preParsingHookHandler,
} from 'fastify';
import {
  type CapturedResponse,
  ConfigError,
  createIdempotency,
  type IdempotencyContext,
  type IdempotencyError,
  type IdempotencyOptions,
  type Outcome,
  type StoredResponse,
} from '../core/index.js';
import { closeAfterDrain } from './node-http.js';
import { captureBody } from './payload.js';

export interface FastifyIdempotencyOptions extends IdempotencyOptions<FastifyRequest> {
  /**
   * `true`: the plugin answers engine errors (bad or missing key 400, conflict 409/422, in
   * progress 409, body too large 413, store down 503) itself, as JSON (or `onError`'s rendering).
   * `false`: they are thrown into Fastify's error path (`setErrorHandler`); the error is an
   * `IdempotencyError` with `statusCode`, `code`, `headers` (e.g. `retry-after`) and `key`.
   * @default true
   */
  renderErrors?: boolean;
}

/** A route's `config.idempotency`: overrides of the plugin's options, or `false` to leave it unguarded. */
export type FastifyRouteIdempotency = Partial<FastifyIdempotencyOptions> | false;

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by `retrysafe/fastify` on requests guarded by an Idempotency-Key; `undefined` otherwise. */
    idempotency: IdempotencyContext | undefined;
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
  outcome: Promise<Outcome>;
  settled: boolean;
}

/**
 * Fastify 5 plugin guarding POST/PATCH routes with Idempotency-Key. Plugin options are the
 * defaults of every route registered after it (it is not encapsulated: `await` the register
 * before declaring routes); a route's `config: { idempotency: {...} }` overrides them, and
 * `config: { idempotency: false }` leaves a route unguarded. The guarded handler finds
 * `request.idempotency`; what it sends (object, string, Buffer or stream) is captured in
 * `onSend`, saved, and replayed to retries byte for byte. A stream larger than
 * `maxResponseBytes` is streamed through in lease mode, not saved, and the key released. An
 * error the handler throws releases the key before Fastify's error handler answers it.
 * Fastify's own `bodyLimit` applies before `maxBodyBytes`.
 * @example
 * await app.register(idempotency, { store, ttl: '7d' });
 * app.post('/orders', { config: { idempotency: { required: true } } }, async (request, reply) => {
 *   reply.code(201).header('location', `/orders/${id}`);
 *   return { id, key: request.idempotency?.key };
 * });
 */
export const idempotency: FastifyPluginCallback<FastifyIdempotencyOptions> = Object.assign(
  function retrysafe(
    fastify: FastifyInstance,
    options: FastifyIdempotencyOptions,
    done: (err?: Error) => void,
  ) {
    let defaults: RouteHooks;
    try {
      defaults = routeGuard(options);
    } catch (error) {
      return done(error as Error);
    }
    if (!fastify.hasRequestDecorator('idempotency')) fastify.decorateRequest('idempotency', undefined);
    fastify.addHook('onRoute', function retrysafeOnRoute(route) {
      const own = route.config?.idempotency;
      if (own === false) return;
      const guard = own === undefined ? defaults : routeGuard({ ...options, ...own });
      route.preParsing = [...hooks(route.preParsing), guard.preParsing];
      route.preHandler = [...hooks(route.preHandler), guard.preHandler];
      route.onSend = [...hooks(route.onSend), guard.onSend];
      route.onError = [...hooks(route.onError), guard.onError];
    });
    done();
  },
  // What fastify-plugin does: the onRoute hook must see the routes of the parent context.
  { [Symbol.for('skip-override')]: true, [Symbol.for('fastify.display-name')]: 'retrysafe' },
);

function hooks<T>(value: T | T[] | undefined): T[] {
  if (value === undefined) return [];
  return Array.isArray(value) ? value : [value];
}

type RouteHooks = {
  preParsing: preParsingHookHandler;
  preHandler: preHandlerAsyncHookHandler;
  onSend: onSendHookHandler;
  onError: onErrorHookHandler;
};

function routeGuard(options: FastifyIdempotencyOptions): RouteHooks {
  const { renderErrors = true, ...engineOptions } = options ?? ({} as FastifyIdempotencyOptions);
  if (typeof renderErrors !== 'boolean') {
    throw new ConfigError('retrysafe: option `renderErrors` must be a boolean');
  }
  const engine = createIdempotency<FastifyRequest, unknown>(engineOptions);
  const bodies = new WeakMap<FastifyRequest, RawBody>();
  const pending = new WeakMap<FastifyRequest, Pending>();

  const reject = (reply: FastifyReply, error: IdempotencyError) => {
    if (!renderErrors) throw error;
    return sendStored(reply, engine.render(error));
  };

  return {
    preParsing: function retrysafePreParsing(request, _reply, payload, done) {
      if (request.headers['idempotency-key'] === undefined) return done(null, payload);
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

    preHandler: async function retrysafePreHandler(request, reply) {
      let started!: () => void;
      const handlerStarted = new Promise<undefined>((resolve) => {
        started = () => resolve(undefined);
      });
      const outcome = engine.handle(
        {
          method: request.method,
          path: request.url,
          keyHeader: request.headers['idempotency-key'],
          contentType: request.headers['content-type'],
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
            request.idempotency = ctx;
            pending.set(request, { resolve, reject: rejectCapture, outcome, settled: false });
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
          throw new Error('retrysafe: the engine completed a request whose handler never ran');
      }
    },

    onSend: async function retrysafeOnSend(request, reply, payload) {
      // Fastify refuses an upload past its bodyLimit without reading the rest: read it off before
      // the connection closes, or the client gets a reset instead of this 413.
      if (reply.statusCode === 413) closeAfterDrain(request.raw, reply.raw);
      const waiting = pending.get(request);
      if (waiting === undefined || waiting.settled) return payload;
      waiting.settled = true;
      const collector = engine.collect();
      const captured = await captureBody(collector, payload);
      waiting.resolve(collector.response(reply.statusCode, (name) => reply.getHeader(name)));
      const outcome = await waiting.outcome;
      if (outcome.kind !== 'rejected' && outcome.kind !== 'replayed') return captured.payload;
      // Atomic mode could not commit (or the response was too large to), or the handler's lease
      // was lost and another answer was saved: nothing of the handler's response may reach the
      // client, its headers included.
      for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
      const answer = outcome.kind === 'replayed' ? outcome.response : engine.render(outcome.error);
      reply.code(answer.status).headers(answer.headers);
      return Buffer.from(answer.body);
    },

    onError: async function retrysafeOnError(request, _reply, error) {
      const waiting = pending.get(request);
      if (waiting === undefined || waiting.settled) return;
      waiting.settled = true;
      waiting.reject(error);
      // The engine releases the key before rethrowing: wait, so a retry sent as soon as the
      // error response arrives finds the key free.
      await waiting.outcome.catch(() => undefined);
    },
  };
}

function sendStored(reply: FastifyReply, response: StoredResponse): FastifyReply {
  return reply.code(response.status).headers(response.headers).send(Buffer.from(response.body));
}
