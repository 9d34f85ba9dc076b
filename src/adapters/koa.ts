import type { OutgoingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import type { Context, Middleware } from 'koa';
import {
  createIdempotency,
  type Idempotency,
  parsedBody,
  type RequestBody,
  type ResponseCollector,
  type StoredResponse,
} from '../core/adapter.js';
import type { RegisteredTx } from '../core/contract/index.js';
import type { IdempotencyContext } from '../core/engine/index.js';
import type { IdempotencyOptions } from '../core/options/index.js';
import {
  captureBody,
  clearForAnswer,
  keyHeaderOf,
  type NodeListener,
  nodeDispatch,
  RESUME_HEADER,
  type RenderErrorsOption,
  type ResumesThrough,
  readBody,
  resumeVia,
  splitAdapterOptions,
  takeResume,
} from './kit/index.js';

/** Options of `retrysafe/koa`'s `idempotency`: the engine's, plus `renderErrors`. */
export interface KoaIdempotencyOptions<Tx = RegisteredTx>
  extends IdempotencyOptions<Context, Tx>,
    RenderErrorsOption {
  /**
   * `true`: the middleware answers engine errors (bad or missing key 400, conflict 409/422, in
   * progress 409, body too large 413, store down 503) itself, as JSON (or `onError`'s rendering).
   * `false`: they are thrown to the middlewares upstream and Koa's `app.on('error')`/`ctx.onerror`;
   * the error is an `IdempotencyError` with `status`, `code`, `headers` (e.g. `retry-after`)
   * and `key`.
   * @default true
   * @example renderErrors: false
   */
  renderErrors?: boolean;
}

/** The state the middleware sets: `ctx.state.idempotency`, its `tx` the store's. */
export interface IdempotencyState<Tx = RegisteredTx> {
  /** Set on requests guarded by an Idempotency-Key; `undefined` otherwise. */
  idempotency: IdempotencyContext<Tx> | undefined;
}

// These statuses carry no body; Koa strips whatever ctx.body holds.
const EMPTY_STATUS = new Set([204, 205, 304]);

/**
 * Koa 2 and 3 middleware guarding POST/PATCH requests with Idempotency-Key. Mount it after
 * `@koa/bodyparser` (the fingerprint uses `ctx.request.rawBody`, or the parsed body) or without
 * one: the middleware then reads the raw body itself (413 past `maxBodyBytes`) and leaves it in
 * `ctx.request.body` as a Buffer. Downstream middleware finds `ctx.state.idempotency`; the
 * `ctx.body` it leaves (object, string, Buffer, stream, and on Koa 3 Blob, ReadableStream or
 * Response) is captured with `ctx.status` and the response headers, saved, and replayed to
 * retries byte for byte. A body larger than `maxResponseBytes` is streamed through in lease
 * mode, not saved, and the key released. An error thrown downstream (`ctx.throw` included)
 * releases the key and goes on up to Koa's error handling.
 * @example
 * app.use(bodyParser());
 * app.use(idempotency({ store, required: true }));
 * router.post('/orders', (ctx) => {
 *   ctx.status = 201;
 *   ctx.set('location', `/orders/${id}`);
 *   ctx.body = { id, key: ctx.state.idempotency?.key };
 * });
 */
export function idempotency<Tx = RegisteredTx>(
  options: KoaIdempotencyOptions<Tx>,
): Middleware<IdempotencyState<Tx>> & ResumesThrough<{ callback(): NodeListener }> {
  const { renderErrors, engineOptions } = splitAdapterOptions('koa idempotency()', options);
  const engine = createIdempotency<Context, Tx>(engineOptions);

  const middleware: Middleware<IdempotencyState<Tx>> = async function idempotencyMiddleware(ctx, next) {
    const resume = takeResume(ctx.headers[RESUME_HEADER]);
    if (resume !== undefined) {
      await bodyOf(ctx, engine);
      const running = downstream(ctx, next, resume.ctx as IdempotencyContext<Tx>, resume.collect());
      resume.settle(running);
      await running;
      return;
    }
    let before: OutgoingHttpHeaders | undefined;
    const outcome = await engine.handle(
      {
        method: ctx.method,
        path: ctx.originalUrl,
        keyHeader: keyHeaderOf(ctx.req, engine.keyHeader),
        contentType: ctx.get('content-type') || undefined,
        acceptEncoding: ctx.headers['accept-encoding'],
        authorization: ctx.headers.authorization,
        readBody: () => bodyOf(ctx, engine),
        raw: ctx,
      },
      (idem) => {
        before = ctx.res.getHeaders();
        ctx.set(engine.answerHeaders(idem.key));
        return downstream(ctx, next, idem, engine.collect());
      },
    );
    switch (outcome.kind) {
      case 'pass':
        ctx.state.idempotency = undefined;
        return next();
      case 'executed':
        return;
      case 'replayed':
        // After downstream ran too when its lease was lost: none of its headers may leak.
        clearForAnswer(ctx.req, ctx.res, before);
        return answer(ctx, outcome.response);
      case 'rejected':
        // Atomic mode could not commit what downstream answered: none of it may reach the client.
        clearForAnswer(ctx.req, ctx.res, before, outcome.error);
        if (!renderErrors) throw outcome.error;
        return answer(ctx, engine.render(outcome.error));
    }
  };
  return Object.assign(middleware, {
    resumeThrough: (app: { callback(): NodeListener }) =>
      resumeVia(
        engine,
        nodeDispatch(() => app.callback()),
      ),
  });
}

/** Runs the middleware downstream with `idem` in `ctx.state` and captures the `ctx.body` it leaves. */
async function downstream<Tx>(
  ctx: Context,
  next: () => Promise<unknown>,
  idem: IdempotencyContext<Tx>,
  collector: ResponseCollector,
) {
  ctx.state.idempotency = idem;
  await next();
  const captured = await captureBody(collector, payloadOf(ctx));
  // A stream was consumed (an object serialised): Koa sends the bytes read, or what
  // streams on. An undefined body stays so: assigning one would turn a 404 into a 200.
  if (ctx.body !== undefined && captured.payload !== ctx.body) ctx.body = captured.payload;
  return collector.response(ctx.status, (name) => ctx.res.getHeader(name));
}

async function bodyOf(ctx: Context, engine: Idempotency<Context, unknown>): Promise<RequestBody> {
  const request = ctx.request as Context['request'] & { body?: unknown; rawBody?: string };
  // A body parser ran first and read the body: fingerprint the bytes it read, or what it parsed.
  // One that skipped this content type (leaving `{}`) left the stream unread: read it below.
  if (request.body !== undefined && (typeof request.rawBody === 'string' || ctx.req.readableEnded)) {
    return typeof request.rawBody === 'string' ? Buffer.from(request.rawBody) : parsedBody(request.body);
  }
  const body = await readBody(ctx.req, engine);
  // A body parser mounted later sees a body and skips the consumed stream.
  request.body = body;
  return body;
}

/** What Koa's `respond` would write for `ctx.body`, as a string, Buffer or node stream. */
function payloadOf(ctx: Context): unknown {
  const body: unknown = ctx.body;
  if (EMPTY_STATUS.has(ctx.status) || body === null) return null;
  if (body === undefined) {
    // Koa answers the status message as text/plain.
    ctx.type = 'text';
    return ctx.message || String(ctx.status);
  }
  if (typeof body === 'string' || Buffer.isBuffer(body) || body instanceof Readable) return body;
  if (body instanceof Blob) return Readable.from(body.stream());
  if (body instanceof ReadableStream) return Readable.from(body);
  if (body instanceof Response) return body.body === null ? null : Readable.from(body.body);
  return JSON.stringify(body);
}

function answer(ctx: Context, response: StoredResponse): void {
  ctx.status = response.status;
  ctx.body = Buffer.from(response.body);
  // Assigning a Buffer sets application/octet-stream; the stored headers say what was sent.
  if (!('content-type' in response.headers)) ctx.remove('content-type');
  ctx.set(response.headers);
}
